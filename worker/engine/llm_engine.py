"""The serving engine: requests in, streamed ``RequestOutput``s out, one ``step()`` at a time.

The engine glues the pure parts (scheduler, block manager, detokenizer, stop matching) to a
model runner that computes a step and samples (``worker.model.runner.ModelRunner`` on a real
model; any object with ``execute``/``release`` in tests). It does no I/O and is not thread-safe:
one thread owns it (the worker's engine loop).

Example:

    >>> engine = LLMEngine.from_model(model, tokenizer, eos_token_ids={2}, config=EngineConfig())
    >>> engine.add_request("a", engine.encode("Once upon"), SamplingParams(max_tokens=16))
    >>> while engine.has_unfinished_requests():
    ...     for out in engine.step():
    ...         print(out.request_id, out.text_delta, out.finish_reason)
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import tokenizers

from common.tokenizer import encode_prompt
from worker.engine.block_manager import BlockManager, PrefixCacheStats
from worker.engine.config import CacheSpec, EngineConfig
from worker.engine.detokenize import IncrementalDetokenizer
from worker.engine.errors import PromptTooLongError
from worker.engine.outputs import (
    FinishReason,
    RequestMetrics,
    RequestOutput,
    SampleResult,
    TokenLogprobs,
)
from worker.engine.params import SamplingParams
from worker.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from worker.engine.sequence import Sequence as Seq
from worker.engine.stop import StopMatcher

if TYPE_CHECKING:
    from worker.engine.structured import Grammars, MaskBuilder
    from worker.model.llama import LlamaModel


class Runner(Protocol):
    """Computes one scheduled step and samples the next tokens."""

    def execute(self, out: SchedulerOutput) -> list[SampleResult]:
        """One result per scheduled sequence whose ``samples`` is True, in schedule order."""
        ...

    def release(self, request_id: str) -> None:
        """Forget the per-request state (random generator) of a finished request."""
        ...


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine's queues and cache."""

    # requests holding KV blocks
    num_running: int
    # requests queued or preempted
    num_waiting: int
    # preemptions since start
    num_preemptions: int
    # share of KV blocks in use
    kv_cache_usage: float
    # prefix-cache counters since start
    prefix_cache: PrefixCacheStats


class _Request:
    """Engine-side state of one live request (beside its scheduler ``Sequence``)."""

    __slots__ = ("detok", "first_scheduled_time", "matcher", "seq", "stops", "token_times")

    def __init__(self, seq: Seq, tokenizer: tokenizers.Tokenizer, matcher: Any = None) -> None:
        self.seq = seq
        # its structured output's grammar state (an llguidance matcher); None: free text
        self.matcher = matcher
        self.detok = IncrementalDetokenizer(tokenizer, seq.token_ids)
        self.stops = StopMatcher(seq.params.stop)
        self.first_scheduled_time: float | None = None
        self.token_times: list[float] = []


def check_request(
    prompt_ids: Sequence[int], params: SamplingParams, max_model_len: int, vocab_size: int
) -> None:
    """Raise ValueError (PromptTooLongError for sizes) unless the request fits a model of
    `max_model_len` positions and `vocab_size` tokens: every engine's first check."""
    if len(prompt_ids) == 0:
        raise ValueError("prompt: must contain at least one token")
    if len(prompt_ids) + params.max_tokens > max_model_len:
        raise PromptTooLongError(len(prompt_ids), params.max_tokens, max_model_len)
    if not all(0 <= t < vocab_size for t in prompt_ids):
        raise ValueError(f"prompt: token ids must be in [0, {vocab_size})")
    if not all(t < vocab_size for t in params.stop_token_ids):
        raise ValueError(f"stop_token_ids: token ids must be in [0, {vocab_size})")
    if not all(t < vocab_size for t, _ in params.logit_bias):
        raise ValueError(f"logit_bias: token ids must be in [0, {vocab_size})")


def final_text(detok: IncrementalDetokenizer, stops: StopMatcher) -> tuple[str, bool]:
    """Everything a request still held back at its end (cut at a stop string if the flushed
    text completes one: True then, and the stop string wins over eos / length)."""
    text, stopped = stops.feed(detok.flush())
    return (text, True) if stopped else (text + stops.flush(), False)


class LLMEngine:
    """Continuous-batching engine over a paged KV cache (see the module doc)."""

    def __init__(
        self,
        runner: Runner,
        tokenizer: tokenizers.Tokenizer,
        cache: CacheSpec,
        config: EngineConfig,
        *,
        vocab_size: int,
        eos_token_ids: Collection[int] = (),
        bos_token_id: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < min(
            cache.max_model_len, cache.num_tokens
        ):
            raise ValueError(
                "max_num_batched_tokens: without chunked prefill it must hold a whole "
                f"sequence ({cache.max_model_len} tokens), got {config.max_num_batched_tokens}"
            )
        self.runner = runner
        self.tokenizer = tokenizer
        self.cache = cache
        self.config = config
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self.bos_token_id = bos_token_id
        self.max_model_len = cache.max_model_len
        self._clock = clock
        self.block_manager = BlockManager(
            cache.num_blocks,
            cache.block_size,
            config.enable_prefix_caching,
            sliding_window=cache.sliding_window,
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                enable_chunked_prefill=config.enable_chunked_prefill,
            ),
            self.block_manager,
        )
        self._requests: dict[str, _Request] = {}
        # structured outputs (worker.engine.structured), set up by the first request with one
        self._grammars: Grammars | None = None
        self._masks: MaskBuilder | None = None
        self._grammar_lock = threading.Lock()

    @classmethod
    def from_model(
        cls,
        model: LlamaModel,
        tokenizer: tokenizers.Tokenizer,
        eos_token_ids: Collection[int],
        config: EngineConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> LLMEngine:
        """An engine running ``model`` with a KV cache sized by ``config`` (torch imported)."""
        from worker.model.runner import ModelRunner

        runner = ModelRunner(model, config)
        return cls(
            runner,
            tokenizer,
            runner.cache,
            config,
            vocab_size=model.config.vocab_size,
            eos_token_ids=eos_token_ids,
            bos_token_id=model.config.bos_token_id,
            clock=clock,
        )

    # requests -----------------------------------------------------------------------------

    def encode(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``prompt``, starting with bos when the model has one (unless
        ``add_special_tokens`` is False: see ``common.tokenizer.encode_prompt``)."""
        return encode_prompt(self.tokenizer, prompt, self.bos_token_id, add_special_tokens)

    def validate(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise ValueError (PromptTooLongError for sizes) if the request can never run.

        Thread-safe: reads only immutable settings.
        """
        check_request(prompt_ids, params, self.max_model_len, self.vocab_size)
        if self._blocks_alone(len(prompt_ids) + params.max_tokens) > self.cache.num_blocks:
            raise PromptTooLongError(
                len(prompt_ids), params.max_tokens, self.cache.num_tokens, "the KV cache"
            )
        if params.structured is not None:
            self.grammars().matcher(params.structured)  # compiled and cached, or refused

    def grammars(self) -> Grammars:
        """The engine's structured-output grammars (their tokenizer built on first use)."""
        # imported here: llguidance, numpy and torch only for engines that need them
        from worker.engine.structured import Grammars, MaskBuilder

        with self._grammar_lock:
            if self._grammars is None:
                self._grammars = Grammars(self.tokenizer, self.vocab_size, set(self.eos_token_ids))
                self._masks = MaskBuilder(self._grammars)
            return self._grammars

    def _blocks_alone(self, num_tokens: int) -> int:
        """Most KV blocks a sequence of ``num_tokens`` holds at once when it runs alone (so a
        request is accepted only if it can finish even after being preempted)."""
        bs = self.cache.block_size
        whole = -(-num_tokens // bs)
        window = self.cache.sliding_window
        if window is None or not self.config.enable_chunked_prefill:
            return whole  # (without chunks a recompute takes the whole sequence in one step)
        # Blocks out of every future query's window are freed after each step: a step that
        # computes C new tokens after n holds ceil((n + C) / bs) - floor((n - window + 1) / bs)
        # blocks, at most floor((C + window - 1) / bs) + 2, and C <= the token budget.
        chunk = self.config.max_num_batched_tokens
        return min(whole, (chunk + window - 1) // bs + 2)

    def add_request(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request; raises before allocating anything if it is invalid."""
        if request_id in self._requests:
            raise ValueError(f"request_id: {request_id!r} is already running")
        self.validate(prompt_ids, params)
        now = self._clock() if arrival_time is None else arrival_time
        seq = Seq(request_id, prompt_ids, params, priority=priority, arrival_time=now)
        matcher = None
        if params.structured is not None:
            matcher = self.grammars().matcher(params.structured)
        self._requests[request_id] = _Request(seq, self.tokenizer, matcher)
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its blocks; its final output (None if unknown)."""
        req = self._requests.get(request_id)
        if req is None:
            return None
        text, _ = self._final_text(req)
        return self._finish(req, (), text, "abort", None, self._clock())

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._requests)

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_preemptions=self.scheduler.num_preemptions,
            kv_cache_usage=self.block_manager.usage,
            prefix_cache=self.block_manager.stats(),
        )

    # stepping -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule and run one forward pass; outputs of the requests that got a token."""
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        now = self._clock()
        sampling = [s.seq for s in out.scheduled if s.samples]
        for s in out.scheduled:
            req = self._requests[s.seq.request_id]
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
        guided = [self._requests[seq.request_id] for seq in sampling]
        guided = [req for req in guided if req.matcher is not None]
        if guided and self._masks is not None:
            from worker.engine.structured import StepMasks

            # the masks are computed on llguidance's threads while the model runs
            future = self._masks.start([req.matcher for req in guided])
            rows = {req.seq.request_id: i for i, req in enumerate(guided)}
            out = dataclasses.replace(out, masks=StepMasks(rows, future))
        results = self.runner.execute(out)
        assert len(results) == len(sampling), "runner returned the wrong number of samples"
        self.scheduler.update(out)
        now = self._clock()
        outputs = []
        for seq, result in zip(sampling, results, strict=True):
            outputs.append(self._on_token(self._requests[seq.request_id], result, now))
        return outputs

    def _on_token(self, req: _Request, result: SampleResult, now: float) -> RequestOutput:
        seq, params = req.seq, req.seq.params
        token_id = result.token_id
        self.scheduler.append_token(seq, token_id)
        req.token_times.append(now)
        logprobs = None if result.logprobs is None else (result.logprobs,)

        finish: FinishReason | None = None
        text = ""
        is_stop_token = token_id in params.stop_token_ids or (
            not params.ignore_eos and token_id in self.eos_token_ids
        )
        if is_stop_token:
            finish = "stop"  # its text is never shown
        else:
            text, stopped = req.stops.feed(req.detok.add(token_id))
            if stopped:
                return self._finish(req, (token_id,), text, "stop", logprobs, now)
        if req.matcher is not None:
            req.matcher.consume_token(token_id)
            if finish is None and req.matcher.is_stopped():
                finish = "stop"  # the grammar's language ends here
        if finish is None and (
            seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len
        ):
            finish = "length"
        if finish is None:
            return RequestOutput(
                request_id=seq.request_id,
                new_token_ids=(token_id,),
                text_delta=text,
                finished=False,
                finish_reason=None,
                num_prompt_tokens=seq.num_prompt_tokens,
                num_cached_tokens=max(seq.num_cached_tokens, 0),
                num_generated_tokens=seq.num_output_tokens,
                logprobs=logprobs,
            )
        tail, stopped = self._final_text(req)
        return self._finish(
            req, (token_id,), text + tail, "stop" if stopped else finish, logprobs, now
        )

    @staticmethod
    def _final_text(req: _Request) -> tuple[str, bool]:
        return final_text(req.detok, req.stops)

    def _finish(
        self,
        req: _Request,
        new_token_ids: tuple[int, ...],
        text: str,
        reason: FinishReason,
        logprobs: tuple[TokenLogprobs, ...] | None,
        now: float,
    ) -> RequestOutput:
        seq = req.seq
        self.scheduler.finish(seq)
        self.runner.release(seq.request_id)
        del self._requests[seq.request_id]
        times = req.token_times
        metrics = RequestMetrics(
            arrival_time=seq.arrival_time,
            first_scheduled_time=req.first_scheduled_time,
            first_token_time=times[0] if times else None,
            finished_time=now,
            inter_token_latencies_s=tuple(b - a for a, b in itertools.pairwise(times)),
            num_preemptions=seq.num_preemptions,
        )
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new_token_ids,
            text_delta=text,
            finished=True,
            finish_reason=reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=max(seq.num_cached_tokens, 0),
            num_generated_tokens=seq.num_output_tokens,
            logprobs=logprobs,
            metrics=metrics,
        )
