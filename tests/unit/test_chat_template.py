"""Chat templates: found where transformers finds them, and rendered in a bounded child
process: a template that loops, grows without bound or eats memory is refused in about the
timeout, and the renderer serves the next chat (these start a real render process)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from control_plane.services.models import chat_template
from control_plane.services.models.chat_template import (
    DEFAULT_CHAT_TEMPLATE,
    TemplateError,
    find_template,
    render_chat,
)

MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(autouse=True)
def _stop_child() -> Iterator[None]:
    yield
    chat_template.shutdown()


def test_the_template_file_comes_before_the_tokenizer_config() -> None:
    files = {"chat_template.jinja": b"{{ 'file' }}"}
    config = {"chat_template": "config"}
    assert find_template(files.get, config) == "{{ 'file' }}"
    assert find_template({}.get, config) == "config"
    templates = [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]
    named = {"chat_template": templates}
    assert find_template({}.get, named) == "d"
    assert find_template({}.get, {}) is None


def test_renders_with_bos_and_the_generation_prompt() -> None:
    text = render_chat(DEFAULT_CHAT_TEMPLATE, MESSAGES, "<s>", "</s>")
    assert text == "<s><|user|>\nHi\n<|assistant|>\n"
    no_prompt = render_chat(DEFAULT_CHAT_TEMPLATE, MESSAGES, "<s>", "</s>", False)
    assert not no_prompt.endswith("<|assistant|>\n")
    with pytest.raises(TemplateError, match="no system"):
        render_chat("{{ raise_exception('no system') }}", MESSAGES, "", "")


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        # nested loops over a list: no call the sandbox could intercept
        (
            "{% set l = range(100000)|list %}{% for a in l %}{% for b in l %}{% endfor %}"
            "{% endfor %}",
            "longer than",
        ),
        ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "passed"),
        ("{{ 'x' * 2000000000 }}", "memory"),
    ],
)
def test_a_costly_template_is_refused_and_the_next_render_works(template: str, reason: str) -> None:
    render_chat(DEFAULT_CHAT_TEMPLATE, MESSAGES, "", "")  # the child is up
    started = time.monotonic()
    with pytest.raises(TemplateError, match=reason):
        render_chat(template, MESSAGES, "", "")
    assert time.monotonic() - started < chat_template.RENDER_TIMEOUT_S + 3
    assert render_chat(DEFAULT_CHAT_TEMPLATE, MESSAGES, "<s>", "").startswith("<s>")
