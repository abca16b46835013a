"""A simple generate loop: one request at a time, prefill then token-by-token decode.

This is the walking-skeleton engine; the scheduler with continuous batching and a paged KV
cache replaces the loop (not its contracts) later. It does no I/O: the runtime hands it a model
and a tokenizer and streams the ``StepOutput``s it yields.

Finish reasons: ``"stop"`` (an eos token, or a stop string, which is cut from the text),
``"length"`` (``max_tokens`` generated), ``"abort"`` (``should_abort()`` returned True).

Example:

    >>> gen = Generator(model, tokenizer, eos_token_ids={2}, max_context=2048)
    >>> for step in gen.generate("Once upon", SamplingParams(max_tokens=16, stop=("\\n",))):
    ...     print(step.text_delta, end="")
    >>> gen.run("Once upon", SamplingParams(max_tokens=16)).finish_reason
    'length'
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

import tokenizers
import torch

from worker.engine.detokenize import IncrementalDetokenizer
from worker.engine.sampling import SamplingParams, sample
from worker.model.llama import LlamaModel

# token_id of the StepOutput that reports an abort: no token was generated in that step
NO_TOKEN = -1


class PromptTooLongError(ValueError):
    """The prompt plus ``max_tokens`` does not fit in the context window."""

    def __init__(self, prompt_tokens: int, max_tokens: int, limit: int) -> None:
        super().__init__(
            f"prompt: {prompt_tokens} prompt tokens + max_tokens {max_tokens} exceeds the "
            f"context window of {limit} tokens"
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.limit = limit


@dataclass(frozen=True, slots=True)
class StepOutput:
    """One generated token of a streamed request."""

    # the generated token; NO_TOKEN (-1) in the final output of an aborted request
    token_id: int
    # text this step adds to the output (may be "": held back for a split character or a
    # possible stop string)
    text_delta: str
    # True in the last output of the request
    finished: bool
    # "stop" | "length" | "abort" when finished, else None
    finish_reason: str | None


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """Whole output of a request (``Generator.run``)."""

    # generated text, stop string excluded
    text: str
    # "stop" | "length" | "abort"
    finish_reason: str
    # prompt length in tokens (bos included)
    prompt_tokens: int
    # tokens generated (an eos or stop-completing token included)
    generated_tokens: int


class Generator:
    """Runs requests one at a time on ``model``; no I/O.

    ``max_context`` caps prompt + generated tokens; it is clamped to the model's
    ``max_position_embeddings``.
    """

    def __init__(
        self,
        model: LlamaModel,
        tokenizer: tokenizers.Tokenizer,
        eos_token_ids: Collection[int],
        max_context: int,
    ) -> None:
        if max_context < 2:
            raise ValueError(f"max_context: must be >= 2, got {max_context}")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_context = min(max_context, model.config.max_position_embeddings)
        self._bos_token_id = model.config.bos_token_id

    def encode(self, prompt: str) -> list[int]:
        """Token ids of ``prompt``, starting with bos when the model has one."""
        ids: list[int] = self.tokenizer.encode(prompt, add_special_tokens=True).ids
        bos = self._bos_token_id
        if bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)  # the tokenizer's post-processor did not add it
        return ids

    def validate(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise ValueError for an empty prompt, PromptTooLongError when it does not fit."""
        if len(prompt_ids) == 0:
            raise ValueError("prompt: must contain at least one token")
        if len(prompt_ids) + params.max_tokens > self.max_context:
            raise PromptTooLongError(len(prompt_ids), params.max_tokens, self.max_context)
        vocab_size = self.model.config.vocab_size
        if not all(0 <= t < vocab_size for t in prompt_ids):
            raise ValueError(f"prompt: token ids must be in [0, {vocab_size})")

    def generate(
        self,
        prompt: str,
        params: SamplingParams,
        should_abort: Callable[[], bool] = lambda: False,
    ) -> Iterator[StepOutput]:
        """Stream one StepOutput per generated token; the last one has ``finished=True``.

        Validation happens here, before the first ``next()``.
        """
        return self.generate_ids(self.encode(prompt), params, should_abort)

    def generate_ids(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        should_abort: Callable[[], bool] = lambda: False,
    ) -> Iterator[StepOutput]:
        """``generate`` for an already tokenized prompt (used as is: no bos added)."""
        self.validate(prompt_ids, params)
        return self._steps(list(prompt_ids), params, should_abort)

    def run(self, prompt: str, params: SamplingParams) -> GenerationResult:
        """Generate to the end and return the whole text."""
        prompt_ids = self.encode(prompt)
        parts: list[str] = []
        generated_tokens = 0
        finish_reason = "abort"  # replaced below: the stream always ends with a finished step
        for step in self.generate_ids(prompt_ids, params):
            parts.append(step.text_delta)
            generated_tokens += step.token_id != NO_TOKEN
            if step.finished:
                finish_reason = step.finish_reason or finish_reason
        return GenerationResult(
            text="".join(parts),
            finish_reason=finish_reason,
            prompt_tokens=len(prompt_ids),
            generated_tokens=generated_tokens,
        )

    def _steps(
        self, prompt_ids: list[int], params: SamplingParams, should_abort: Callable[[], bool]
    ) -> Iterator[StepOutput]:
        device = self.model.inv_freq.device
        rng = _request_rng(params, device)
        detok = IncrementalDetokenizer(self.tokenizer, prompt_ids)
        stops = _StopMatcher(params.stop)
        cache = self.model.new_cache(batch_size=1, max_len=len(prompt_ids) + params.max_tokens)
        # input_ids, positions: [1, seq]; the whole prompt first (prefill), then one token
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
        positions = torch.arange(len(prompt_ids), device=device)[None]

        for num_generated in range(1, params.max_tokens + 1):
            if should_abort():
                text, _ = _final_text(detok, stops)
                yield StepOutput(NO_TOKEN, text, True, "abort")
                return
            with torch.inference_mode():
                # logits: [1, vocab]
                logits = self.model(input_ids, positions, cache)
            token_id = sample(logits[0], params, rng)

            delta, stopped = stops.feed(detok.add(token_id))
            if stopped:
                yield StepOutput(token_id, delta, True, "stop")
                return
            is_eos = token_id in self.eos_token_ids
            if is_eos or num_generated == params.max_tokens:
                text, stopped = _final_text(detok, stops)
                reason = "stop" if stopped or is_eos else "length"
                yield StepOutput(token_id, delta + text, True, reason)
                return
            yield StepOutput(token_id, delta, False, None)
            input_ids = torch.tensor([[token_id]], dtype=torch.long, device=device)
            positions = torch.tensor([[cache.num_tokens]], dtype=torch.long, device=device)


def _final_text(detok: IncrementalDetokenizer, stops: _StopMatcher) -> tuple[str, bool]:
    """Everything still held back at the end (cut at a stop string if the flushed text
    completes one: True then, and the stop string wins over eos / length)."""
    text, stopped = stops.feed(detok.flush())
    return (text, True) if stopped else (text + stops.flush(), False)


def _request_rng(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """The request's own random generator (None for greedy), so requests never share state."""
    if params.temperature == 0:
        return None
    seed = params.seed if params.seed is not None else random.SystemRandom().getrandbits(63)
    # any int is a valid seed (negative, huge); torch takes [0, 2**64)
    return torch.Generator(device=device).manual_seed(seed % 2**64)


class _StopMatcher:
    """Finds stop strings in streamed text, holding back text that may begin one.

    NOTE: the held-back text is always the longest suffix of the output that is a proper prefix
    of some stop string, so a stop string can only start inside it.
    """

    def __init__(self, stop: tuple[str, ...]) -> None:
        self._stop = stop
        self._held = ""

    def feed(self, delta: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was found)."""
        if not self._stop:
            return delta, False
        text = self._held + delta
        found = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        if found:
            self._held = ""
            return text[: min(found)], True
        keep = max((_overlap(text, s) for s in self._stop), default=0)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """Return the held-back text (generation ended without a stop)."""
        text, self._held = self._held, ""
        return text


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
