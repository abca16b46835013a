"""Chat templates: found where the model ships them, rendered in a separate process with bounds.

A template is code from a tenant's model files. Jinja's sandbox keeps it from reaching Python
objects, but not from looping for minutes or building a string of gigabytes, and a thread
cannot be stopped. So templates render in a child process (`template_child.py`, one per API
process, started on first use): a render past `RENDER_TIMEOUT_S` kills and replaces the child,
one past `MAX_RENDER_CHARS` is stopped by the child itself, one past the child's memory limit
fails there; each is a `TemplateError` (a 400 for the caller) and the API's own memory and
event loop never see it.

Where a template comes from, as transformers reads it: `chat_template.jinja` (what current
transformers saves), else `tokenizer_config.json`'s `chat_template` (a string, or a list of named
templates: the one named `default`), else the platform's role-tagged default.

Example:

    >>> render_chat(DEFAULT_CHAT_TEMPLATE, [{"role": "user", "content": "Hi"}], "<s>", "</s>")
    '<s><|user|>\\nHi\\n<|assistant|>\\n'
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from control_plane.errors import TemplateError
from control_plane.services.models import template_child

# Used when the model ships no chat template (the demo model has none); like a model's own,
# it writes the BOS token itself (the rendered chat is tokenized without adding it).
DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|tools|>\n{{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>"
    "{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}"
    "</tool_call>{% endfor %}{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Real templates render in well under 10 ms; a chat's prompt is at most ~200,000 characters.
RENDER_TIMEOUT_S = 2.0
MAX_RENDER_CHARS = template_child.MAX_RENDER_CHARS
# How long a render may wait for the child another render is using.
QUEUE_WAIT_S = 10.0


def find_template(read: Callable[[str], bytes | None], tok_config: dict[str, Any]) -> str | None:
    """The model's own template: `read(name)` gives a model file's bytes, None when absent."""
    jinja = read("chat_template.jinja")
    if jinja is not None:
        return jinja.decode()
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


class _Child:
    """The render process and the pipe to it; one render at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Connection | None = None

    def _start(self) -> Connection:
        # spawn: the API process has threads, and the child needs nothing of its memory
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe()
        process = ctx.Process(
            target=template_child.serve, args=(theirs,), name="chat-template", daemon=True
        )
        process.start()
        theirs.close()
        self._process, self._conn = process, ours
        return ours

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(5)
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    def render(self, request: dict[str, Any]) -> str:
        if not self._lock.acquire(timeout=QUEUE_WAIT_S):
            raise TemplateError(
                "the chat template renderer is busy; retry shortly", param="messages"
            )
        try:
            conn = self._conn if self._process is not None and self._process.is_alive() else None
            if conn is None:
                self._stop()
                conn = self._start()
            conn.send(request)
            if not conn.poll(RENDER_TIMEOUT_S):
                self._stop()  # it may loop forever: it is replaced
                raise TemplateError(
                    f"the chat template took longer than {RENDER_TIMEOUT_S:g} s to render",
                    param="messages",
                )
            try:
                ok, value = conn.recv()
            except EOFError:  # the child died (its memory limit)
                self._stop()
                raise TemplateError(
                    "the chat template used too much memory", param="messages"
                ) from None
        finally:
            self._lock.release()
        if not ok:
            raise TemplateError(
                f"the chat template could not render these messages: {value}", param="messages"
            )
        return str(value)

    def close(self) -> None:
        with self._lock:
            self._stop()


_child = _Child()


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    bos: str,
    eos: str,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """Render a Hugging Face chat template, bounded (see the module doc); `tools` as
    transformers passes them (None when the call has none). Blocks: call it from a thread,
    never on the event loop."""
    return _child.render(
        {
            "template": template,
            "messages": messages,
            "bos_token": bos,
            "eos_token": eos,
            "add_generation_prompt": add_generation_prompt,
            "tools": tools,
        }
    )


def shutdown() -> None:
    """Stop the render process (the API's shutdown; a later render starts a new one)."""
    _child.close()
