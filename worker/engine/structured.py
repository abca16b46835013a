"""Structured outputs: a request's grammar (a JSON schema, a regex, a Lark/EBNF grammar, or a
list of choices) turned into a per-step token mask, so that every token sampled keeps the text
a prefix of the grammar's language, and the request stops where the grammar ends.

Built on llguidance (the grammar engine of Guidance; vLLM and SGLang offer it beside
xgrammar). Both computed a mask in ~60 µs per token on a 32,000-token vocabulary here; this
one has no dependencies (xgrammar brings transformers and takes 1.3 s to import, on a cold
start's path), reads `tokenizer.json` as it is, and computes a batch's masks on its own
threads without the GIL, which lets them overlap the forward pass (`MaskBuilder`).

Example:

    >>> grammars = Grammars(tokenizer, vocab_size=32000, eos_token_ids={2})
    >>> matcher = grammars.matcher(Structured("json", '{"type": "object"}'))
    >>> masks = MaskBuilder(grammars).start([matcher])  # while the model runs
    >>> banned = masks.result()  # [1, vocab] bool
    >>> matcher.consume_token(token_id)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from common.grammars import grammar_text
from common.job_input import Structured

# Compiled grammars kept per engine (one deployment): a repeated schema costs nothing.
GRAMMAR_CACHE_SIZE = 256


class Grammars:
    """The engine's tokenizer as llguidance sees it, and its compiled grammars (LRU)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: set[int]) -> None:
        import llguidance

        self.vocab_size = vocab_size
        eos = sorted(eos_token_ids) or None
        self._tokenizer = llguidance.LLTokenizer(
            tokenizer.to_str(), n_vocab=vocab_size, eos_token=eos
        )
        self._lock = threading.Lock()
        self._grammars: OrderedDict[Structured, str] = OrderedDict()

    def matcher(self, spec: Structured) -> Any:
        """A new matcher of `spec` (an `llguidance.LLMatcher`); ValueError names what is wrong
        with the grammar."""
        import llguidance

        grammar = self._compiled(spec)
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"structured: {matcher.get_error()}")
        return matcher

    def _compiled(self, spec: Structured) -> str:
        import llguidance

        with self._lock:
            found = self._grammars.get(spec)
            if found is not None:
                self._grammars.move_to_end(spec)
                return found
        try:
            grammar = grammar_text(spec)
        except ValueError as exc:
            raise ValueError(f"structured: {exc}") from None
        error = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer)
        if error and not error.startswith("WARNING"):
            raise ValueError(f"structured: {error}")
        with self._lock:
            self._grammars[spec] = grammar
            while len(self._grammars) > GRAMMAR_CACHE_SIZE:
                self._grammars.popitem(last=False)
        return grammar


@dataclass(frozen=True)
class StepMasks:
    """One step's masks: the row of each guided sequence, and the masks being computed."""

    # request id -> row of the masks tensor
    rows: dict[str, int]
    future: Future[torch.Tensor]

    def of(self, request_ids: list[str]) -> torch.Tensor | list[torch.Tensor | None]:
        """The tokens each request may not take ([vocab] bool rows; None for a free one); the
        whole [len(request_ids), vocab] tensor when every request is guided, in this order (one
        masking op). Waits for the masks."""
        banned = self.future.result()
        rows = [self.rows.get(rid) for rid in request_ids]
        if rows == list(range(banned.shape[0])):
            return banned
        return [None if r is None else banned[r] for r in rows]


class MaskBuilder:
    """Computes one step's masks on llguidance's threads (the GIL released) while the forward
    pass runs; `result()` waits for them."""

    def __init__(self, grammars: Grammars) -> None:
        import llguidance

        self._grammars = grammars
        self._words = (grammars.vocab_size + 31) // 32
        self._executor = llguidance.LLExecutor()
        # one thread: it only hands the batch to llguidance's own pool
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")

    def start(self, matchers: list[Any]) -> Future[torch.Tensor]:
        """The tokens each of `matchers` bans ([len(matchers), vocab] bool), being computed."""
        return self._pool.submit(self._compute, matchers)

    def _compute(self, matchers: list[Any]) -> torch.Tensor:
        words = np.full((len(matchers), self._words), -1, dtype=np.int32)
        pairs = [(m, i) for i, m in enumerate(matchers)]
        self._executor.unsafe_compute_mask_ptr(
            pairs, words.ctypes.data, self._words * 4, len(matchers)
        )
        # bit t of the words: token t allowed; inverted and unpacked here, off the model's path
        banned = np.unpackbits(np.invert(words).view(np.uint8), axis=1, bitorder="little")
        return torch.from_numpy(banned[:, : self._grammars.vocab_size]).view(torch.bool)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
