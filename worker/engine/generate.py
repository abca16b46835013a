"""``Generator``: run prompts on a model in process, through its own ``LLMEngine``; no I/O.

An offline, iterator-style front end: ``encode``, ``validate``, ``generate`` (one
``StepOutput`` per token), ``run`` and ``run_batch`` (one ``GenerationResult`` per prompt).
Several ``generate`` iterators may be open at once; they share the engine's batches. The demo
model's sample (``python -m worker.model.demo``) and the tests that compare tokens with
``transformers`` use it. The worker runtime does not: it builds an ``LLMEngine`` from a
``worker.runtime.loading.LoadedModel`` and drives it from its engine loop
(``worker.runtime.engine_loop``).

Finish reasons: ``"stop"`` (an eos or stop token, or a stop string, which is cut from the
text), ``"length"`` (``max_tokens`` generated), ``"abort"`` (``should_abort()`` returned True).

Example:

    >>> gen = Generator(model, tokenizer, eos_token_ids={2}, max_context=2048)
    >>> for step in gen.generate("Once upon", SamplingParams(max_tokens=16, stop=("\\n",))):
    ...     print(step.text_delta, end="")
    >>> gen.run("Once upon", SamplingParams(max_tokens=16)).finish_reason
    'length'
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

import tokenizers

from common.tokenizer import encode_prompt
from worker.engine.config import EngineConfig
from worker.engine.errors import PromptTooLongError
from worker.engine.llm_engine import LLMEngine
from worker.engine.outputs import RequestOutput
from worker.engine.params import SamplingParams
from worker.model.llama import LlamaModel

__all__ = ["NO_TOKEN", "GenerationResult", "Generator", "PromptTooLongError", "StepOutput"]

# token_id of the StepOutput that reports an abort: no token was generated in that step
NO_TOKEN = -1


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
    # token ids generated
    token_ids: tuple[int, ...] = ()


class Generator:
    """Runs requests on ``model`` through a continuous-batching engine; no I/O.

    ``max_context`` caps prompt + generated tokens; it is clamped to the model's
    ``max_position_embeddings``. The engine (and its KV cache) is built on first use.
    """

    def __init__(
        self,
        model: LlamaModel,
        tokenizer: tokenizers.Tokenizer,
        eos_token_ids: Collection[int],
        max_context: int,
        config: EngineConfig | None = None,
    ) -> None:
        if max_context < 2:
            raise ValueError(f"max_context: must be >= 2, got {max_context}")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_context = min(max_context, model.config.max_position_embeddings)
        self._config = config
        self._engine: LLMEngine | None = None
        self._bos_token_id = model.config.bos_token_id
        self._ids = itertools.count()
        # outputs of open requests not yet consumed by their iterators
        self._pending: dict[str, deque[RequestOutput]] = {}

    def engine_config(self) -> EngineConfig:
        """The engine settings this generator uses (max_model_len capped at max_context)."""
        base = self._config or EngineConfig(max_num_seqs=16)
        max_model_len = min(base.max_model_len or self.max_context, self.max_context)
        return dataclasses.replace(base, max_model_len=max_model_len)

    @property
    def engine(self) -> LLMEngine:
        if self._engine is None:
            self._engine = LLMEngine.from_model(
                self.model, self.tokenizer, self.eos_token_ids, self.engine_config()
            )
        return self._engine

    def encode(self, prompt: str) -> list[int]:
        """Token ids of ``prompt``, starting with bos when the model has one."""
        return encode_prompt(self.tokenizer, prompt, self._bos_token_id)

    def validate(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise ValueError for an empty prompt, PromptTooLongError when it does not fit."""
        self.engine.validate(prompt_ids, params)

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
        request_id = f"gen-{next(self._ids)}"
        self.engine.add_request(request_id, prompt_ids, params)
        self._pending[request_id] = deque()
        return self._steps(request_id, should_abort)

    def run(self, prompt: str, params: SamplingParams) -> GenerationResult:
        """Generate to the end and return the whole text."""
        return self.run_batch([prompt], params)[0]

    def run_batch(
        self, prompts: Sequence[str | Sequence[int]], params: SamplingParams
    ) -> list[GenerationResult]:
        """Generate for several prompts (text, or token ids used as is) in shared batches."""
        ids = [self.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        iterators = [self.generate_ids(p, params) for p in ids]
        steps: list[list[StepOutput]] = [[] for _ in prompts]
        open_ = set(range(len(prompts)))
        while open_:
            for i in sorted(open_):
                step = next(iterators[i])
                steps[i].append(step)
                if step.finished:
                    open_.discard(i)
        return [_result(s, len(p)) for s, p in zip(steps, ids, strict=True)]

    def _steps(self, request_id: str, should_abort: Callable[[], bool]) -> Iterator[StepOutput]:
        pending = self._pending[request_id]
        try:
            while True:
                if not pending and should_abort():
                    final = self.engine.abort_request(request_id)
                    assert final is not None
                    yield StepOutput(NO_TOKEN, final.text_delta, True, "abort")
                    return
                while not pending:
                    for out in self.engine.step():
                        self._pending[out.request_id].append(out)  # only open requests run
                out = pending.popleft()
                yield StepOutput(
                    out.new_token_ids[0], out.text_delta, out.finished, out.finish_reason
                )
                if out.finished:
                    return
        finally:
            self._pending.pop(request_id, None)
            if self._engine is not None:
                self._engine.abort_request(request_id)  # no-op unless the caller gave up


def _result(steps: list[StepOutput], num_prompt_tokens: int) -> GenerationResult:
    tokens = tuple(s.token_id for s in steps if s.token_id != NO_TOKEN)
    return GenerationResult(
        text="".join(s.text_delta for s in steps),
        finish_reason=steps[-1].finish_reason or "abort",
        prompt_tokens=num_prompt_tokens,
        generated_tokens=len(tokens),
        token_ids=tokens,
    )
