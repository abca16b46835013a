"""What the engine hands back: one ``RequestOutput`` per request per step that produced a token
(for streaming), and a final one with the finish reason and the request's timings.

Pure data (no torch). Times are seconds on the engine's clock (``time.monotonic`` unless a
clock is injected).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """Log-probabilities around one generated token (after penalties, before temperature)."""

    # the generated token
    token_id: int
    # its log-probability
    logprob: float
    # the most likely tokens and their log-probabilities, best first (SamplingParams.logprobs)
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class SampleResult:
    """What the model runner sampled for one sequence in one step."""

    # the next token
    token_id: int
    # when the request asked for logprobs, else None
    logprobs: TokenLogprobs | None = None


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """Timings of one request (engine clock, seconds)."""

    # entered the engine
    arrival_time: float
    # first scheduled (admitted) for computation
    first_scheduled_time: float | None
    # first token produced
    first_token_time: float | None
    # finished (or aborted)
    finished_time: float
    # gaps between consecutive tokens
    inter_token_latencies_s: tuple[float, ...]
    # times the request lost its KV cache and was recomputed
    num_preemptions: int

    @property
    def queue_s(self) -> float | None:
        """Waiting before the first computation."""
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, from arrival."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def mean_itl_s(self) -> float | None:
        itl = self.inter_token_latencies_s
        return statistics.fmean(itl) if itl else None

    def to_dict(self) -> dict[str, Any]:
        """Summary for JSON outputs (no per-token lists)."""
        itl = self.inter_token_latencies_s
        return {
            "queue_s": _round(self.queue_s),
            "ttft_s": _round(self.ttft_s),
            "itl_mean_s": _round(self.mean_itl_s),
            "itl_max_s": _round(max(itl) if itl else None),
            "e2e_s": _round(self.finished_time - self.arrival_time),
            "preemptions": self.num_preemptions,
        }


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """The new part of one request's output after a step."""

    request_id: str
    # tokens generated this step (usually one; none in an abort's final output)
    new_token_ids: tuple[int, ...]
    # text they add (may be "": held back for a split character or a possible stop string)
    text_delta: str
    # True in the request's last output
    finished: bool
    # "stop" (eos, stop token or stop string), "length" (max_tokens) or "abort"; None until
    # finished
    finish_reason: FinishReason | None
    # prompt length in tokens
    num_prompt_tokens: int
    # prompt tokens served from the prefix cache at admission
    num_cached_tokens: int
    # tokens generated so far (a final eos or stop token included)
    num_generated_tokens: int
    # per new token, when the request asked for logprobs
    logprobs: tuple[TokenLogprobs, ...] | None = None
    # set on the final output
    metrics: RequestMetrics | None = None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)
