"""`VllmEngine`: vLLM's engine with the built-in engine's methods, for the engine thread.

The engine thread (worker/runtime/engine_loop.py) calls `add_request`, `step`,
`abort_request`, `has_unfinished_requests` and `stats`; the job flow calls `encode` and
`validate` before a job reaches it. Here those go to vLLM's `LLMEngine` (vLLM's scheduler,
paged KV cache, prefix cache, sampling, stop strings and structured outputs), and vLLM's
outputs come back as the built-in engine's `RequestOutput`s: text deltas, token counts, the
tokens served from the prefix cache, log-probabilities, and the request's timings (taken
here, on the same clock as the built-in engine's).

vLLM works in token ids only. The text is made here exactly as the built-in engine makes it:
prompts tokenized with the same `tokenizers.Tokenizer` and BOS rule, outputs detokenized
incrementally (`worker.engine.detokenize`) and stop strings matched in the text
(`worker.engine.stop`: the request is then aborted inside vLLM). So a deployment answers the
same text on either engine for the same tokens, streamed in the same deltas; an end-of-sequence
or stop token ends the request without showing its text, as there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common.tokenizer import encode_prompt
from worker.engine.block_manager import PrefixCacheStats
from worker.engine.config import CacheSpec
from worker.engine.detokenize import IncrementalDetokenizer
from worker.engine.llm_engine import EngineStats, check_request, final_text
from worker.engine.outputs import FinishReason, RequestMetrics, RequestOutput, TokenLogprobs
from worker.engine.params import SamplingParams
from worker.engine.stop import StopMatcher
from worker.vllm.params import finish_reason, sampling_kwargs, token_logprobs

if TYPE_CHECKING:
    import tokenizers


@dataclass(slots=True)
class _Request:
    """What the adapter keeps of a request vLLM runs: counts and times, never text."""

    num_prompt_tokens: int
    logprobs: int | None
    arrival_time: float
    detok: IncrementalDetokenizer
    stops: StopMatcher
    num_cached_tokens: int = 0
    num_generated_tokens: int = 0
    first_token_time: float | None = None
    last_token_time: float | None = None
    itl: list[float] = field(default_factory=list)


class VllmEngine:
    """vLLM's `LLMEngine` behind the built-in engine's interface (see the module doc). Like
    the built-in engine it is driven by one thread."""

    def __init__(
        self,
        llm_engine: Any,
        tokenizer: tokenizers.Tokenizer,
        cache: CacheSpec,
        *,
        vocab_size: int,
        bos_token_id: int | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        self._engine = llm_engine
        self._vllm_params = VllmSamplingParams
        self._structured = StructuredOutputsParams
        self._prompt = TokensPrompt
        self._delta = RequestOutputKind.DELTA
        self.tokenizer = tokenizer
        self.cache = cache
        self.max_model_len = cache.max_model_len
        self.vocab_size = vocab_size
        self.bos_token_id = bos_token_id
        self._clock = clock
        self._requests: dict[str, _Request] = {}
        self._prefix_queries = 0
        self._prefix_hits = 0

    # requests -----------------------------------------------------------------------------

    def encode(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.bos_token_id, add_special_tokens)

    def validate(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise ValueError (PromptTooLongError for sizes) if the request can never run (vLLM
        pages its cache and preempts; a sequence of `max_model_len` fits it: build.py)."""
        check_request(prompt_ids, params, self.max_model_len, self.vocab_size)

    def add_request(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request in vLLM; raises ValueError before queuing if it is invalid."""
        if request_id in self._requests:
            raise ValueError(f"request_id: {request_id!r} is already running")
        self.validate(prompt_ids, params)
        kwargs = sampling_kwargs(params)
        structured = kwargs.pop("structured_outputs", None)
        vparams = self._vllm_params(
            **kwargs,
            output_kind=self._delta,
            detokenize=False,
            structured_outputs=None if structured is None else self._structured(**structured),
        )
        now = self._clock() if arrival_time is None else arrival_time
        self._engine.add_request(
            request_id,
            self._prompt(prompt_token_ids=list(prompt_ids)),
            vparams,
            priority=priority,
        )
        self._requests[request_id] = _Request(
            len(prompt_ids),
            params.logprobs,
            now,
            IncrementalDetokenizer(self.tokenizer, prompt_ids),
            StopMatcher(params.stop),
        )

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now (aborted inside vLLM: its KV blocks freed); its final output
        (None if unknown)."""
        req = self._requests.get(request_id)
        if req is None:
            return None
        self._engine.abort_request([request_id])
        text, _ = final_text(req.detok, req.stops)
        return self._final(request_id, req, (), text, "abort", None)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests) or bool(self._engine.has_unfinished_requests())

    def stats(self) -> EngineStats:
        """vLLM's queues and KV-cache use (its scheduler, when it runs in this process)."""
        scheduler = _scheduler(self._engine)
        usage = 0.0
        running, waiting = len(self._requests), 0
        if scheduler is not None:
            running, waiting = len(scheduler.running), len(scheduler.waiting)
            usage = float(scheduler.kv_cache_manager.usage)
        return EngineStats(
            num_running=running,
            num_waiting=waiting,
            num_preemptions=0,
            kv_cache_usage=usage,
            prefix_cache=PrefixCacheStats(self._prefix_queries, self._prefix_hits, 0),
        )

    # stepping -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One vLLM step; outputs of the requests that got tokens (or finished)."""
        outs = []
        for ro in self._engine.step():
            req = self._requests.get(ro.request_id)
            if req is None or not ro.outputs:
                continue
            completion = ro.outputs[0]
            new = tuple(completion.token_ids)
            self._note_tokens(req, ro, len(new))
            lps = None
            if req.logprobs is not None and completion.logprobs:
                lps = token_logprobs(new, completion.logprobs, req.logprobs)
            reason = finish_reason(completion.finish_reason) if ro.finished else None
            # vLLM's stop_reason: None for an end-of-sequence token, the id of a stop token
            hidden = reason == "stop" and not isinstance(completion.stop_reason, str)
            shown = new[:-1] if hidden and new else new
            text, stopped = "", False
            for token_id in shown:
                piece, stopped = req.stops.feed(req.detok.add(token_id))
                text += piece
                if stopped:
                    break
            if stopped:  # a stop string: vLLM would go on
                if not ro.finished:
                    self._engine.abort_request([ro.request_id])
                outs.append(self._final(ro.request_id, req, new, text, "stop", lps))
                continue
            if reason is not None:
                tail, stopped = final_text(req.detok, req.stops)
                reason = "stop" if stopped else reason
                outs.append(self._final(ro.request_id, req, new, text + tail, reason, lps))
                continue
            outs.append(_output(ro.request_id, req, new, text, None, lps, None))
        return outs

    def _note_tokens(self, req: _Request, ro: Any, count: int) -> None:
        """Counts and times of `count` new tokens (the first: the prefix cache's hits)."""
        if not count:
            return
        now = self._clock()
        if req.first_token_time is None:
            req.first_token_time = now
            req.num_cached_tokens = int(getattr(ro, "num_cached_tokens", 0) or 0)
            self._prefix_queries += req.num_prompt_tokens
            self._prefix_hits += req.num_cached_tokens
        elif req.last_token_time is not None:
            req.itl.append(now - req.last_token_time)
        req.last_token_time = now
        req.num_generated_tokens += count

    def _final(
        self,
        request_id: str,
        req: _Request,
        new: tuple[int, ...],
        text: str,
        reason: FinishReason,
        lps: tuple[TokenLogprobs, ...] | None,
    ) -> RequestOutput:
        del self._requests[request_id]
        now = self._clock()
        metrics = RequestMetrics(
            arrival_time=req.arrival_time,
            # vLLM's scheduler does not say when it first ran the request: its first token
            # bounds it
            first_scheduled_time=req.first_token_time,
            first_token_time=req.first_token_time,
            finished_time=now,
            inter_token_latencies_s=tuple(req.itl),
            num_preemptions=0,
        )
        return _output(request_id, req, new, text, reason, lps, metrics)


def _output(
    request_id: str,
    req: _Request,
    new: tuple[int, ...],
    text: str,
    reason: FinishReason | None,
    lps: tuple[TokenLogprobs, ...] | None,
    metrics: RequestMetrics | None,
) -> RequestOutput:
    """The request's output of this step (final when `reason` is set)."""
    return RequestOutput(
        request_id=request_id,
        new_token_ids=new,
        text_delta=text,
        finished=reason is not None,
        finish_reason=reason,
        num_prompt_tokens=req.num_prompt_tokens,
        num_cached_tokens=req.num_cached_tokens,
        num_generated_tokens=req.num_generated_tokens,
        logprobs=lps,
        metrics=metrics,
    )


def _scheduler(llm_engine: Any) -> Any:
    """vLLM's scheduler when its engine core runs in this process (else None: its counters
    are in the core's process)."""
    core = getattr(getattr(llm_engine, "engine_core", None), "engine_core", None)
    return getattr(core, "scheduler", None)
