"""What the API needs to know of a deployment's model without loading it: context length,
tokenizer (to count prompt tokens at the edge) and chat template.

Read once per deployment version from the model directory (config.json, tokenizer.json,
tokenizer_config.json) and cached in process. Never imports torch.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from common.model_config import ModelConfig
from common.tokenizer import encode_prompt
from control_plane.errors import ControlPlaneError
from control_plane.services.models.chat_template import (
    DEFAULT_CHAT_TEMPLATE,
    find_template,
    render_chat,
)
from control_plane.services.storage import object_store, storage_access
from control_plane.services.storage.storage_access import Access
from control_plane.settings import Settings

log = logging.getLogger(__name__)
# A model directory that could not be read is retried after this long.
NEGATIVE_TTL_S = 30.0
# A call waits this long for a read of the same metadata already under way.
READ_WAIT_S = 30.0
# Model files read at the edge are small; a larger one is refused rather than downloaded.
MAX_META_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ModelMeta:
    max_context: int  # max_position_embeddings: prompt + generated tokens must fit
    vocab_size: int  # token ids a call names (logit_bias, stop_token_ids) are below this
    tokenizer: Any  # tokenizers.Tokenizer
    bos_token_id: int | None  # prepended by the worker when the tokenizer does not add it
    bos_token: str  # for chat templates
    eos_token: str  # for chat templates
    chat_template: str  # Jinja template (the model's own, or DEFAULT_CHAT_TEMPLATE)

    def count_prompt_tokens(self, prompt: str, add_special_tokens: bool = True) -> int:
        return len(encode_prompt(self.tokenizer, prompt, self.bos_token_id, add_special_tokens))

    def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        return render_chat(
            self.chat_template, messages, self.bos_token, self.eos_token, tools=tools
        )


class ModelMetaCache:
    """Per-process cache keyed by (deployment id, version); a failed read is retried later.

    A deploy prefetches its new version (`prefetch`, on a thread), so the first call does not
    wait for the tokenizer; a call that arrives while it is being read waits for that read.
    """

    def __init__(self, settings: Settings, sessions: sessionmaker[Session]) -> None:
        self._settings = settings
        self._sessions = sessions
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, int], ModelMeta] = {}
        self._failures: dict[tuple[str, int], float] = {}
        self._reading: dict[tuple[str, int], threading.Event] = {}

    def prefetch(self, deployment_id: str, version: int, tenant_id: str, model_uri: str) -> None:
        """Read a deployment version's metadata in the background (a deploy just made it)."""
        threading.Thread(
            target=self.get,
            args=(deployment_id, version, tenant_id, model_uri),
            name="model-meta-prefetch",
            daemon=True,
        ).start()

    def get(
        self, deployment_id: str, version: int, tenant_id: str, model_uri: str
    ) -> ModelMeta | None:
        """The metadata of a deployment version, read with what its tenant may read."""
        key = (deployment_id, version)
        with self._lock:
            if key in self._entries:
                return self._entries[key]
            failed_at = self._failures.get(key)
            if failed_at is not None and time.monotonic() - failed_at < NEGATIVE_TTL_S:
                return None
            reading = self._reading.get(key)
            if reading is None:
                self._reading[key] = threading.Event()
        if reading is not None:  # another thread reads it: its answer is ours
            reading.wait(READ_WAIT_S)
            with self._lock:
                return self._entries.get(key)
        try:
            return self._read_entry(key, tenant_id, model_uri)
        finally:
            with self._lock:
                self._reading.pop(key).set()

    def _read_entry(self, key: tuple[str, int], tenant_id: str, model_uri: str) -> ModelMeta | None:
        try:
            with self._sessions() as session:
                access = storage_access.resolve(session, self._settings, tenant_id, model_uri)
            meta = load(access)
        except Exception as exc:
            # The worker will report the real problem; the edge just cannot pre-check.
            log.warning("model metadata of %s unavailable: %s", model_uri, exc)
            with self._lock:
                self._failures[key] = time.monotonic()
            return None
        with self._lock:
            self._entries[key] = meta
        return meta


def _read(access: Access, name: str) -> bytes:
    return object_store.read(access.child(name), MAX_META_BYTES, field="model")


def _read_optional(access: Access, name: str) -> bytes | None:
    try:
        return _read(access, name)
    except ControlPlaneError:
        return None


def load(access: Access) -> ModelMeta:
    from tokenizers import Tokenizer

    # the worker's own parser: a config it would refuse is refused here too (ValueError)
    config = ModelConfig.from_hf_dict(json.loads(_read(access, "config.json")))
    tokenizer = Tokenizer.from_str(_read(access, "tokenizer.json").decode())
    try:
        tok_config = json.loads(_read(access, "tokenizer_config.json"))
    except ControlPlaneError:
        tok_config = {}
    template = find_template(lambda name: _read_optional(access, name), tok_config)
    bos = _token_text(tok_config.get("bos_token"))
    eos = _token_text(tok_config.get("eos_token"))
    return ModelMeta(
        max_context=config.max_position_embeddings,
        vocab_size=config.vocab_size,
        tokenizer=tokenizer,
        bos_token_id=config.bos_token_id,
        bos_token=bos,
        eos_token=eos,
        chat_template=template or DEFAULT_CHAT_TEMPLATE,
    )


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return str(value or "")
