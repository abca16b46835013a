"""What the worker's runtime needs of an engine: the built-in `LLMEngine`
(worker/engine/llm_engine.py) and `VllmEngine` (worker/vllm/engine.py) both are one.

Driven by one thread (the engine loop) except `encode` and `validate`, which the job flow
calls from its own threads and which read only immutable settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import tokenizers

    from worker.engine.config import CacheSpec
    from worker.engine.llm_engine import EngineStats
    from worker.engine.outputs import RequestOutput
    from worker.engine.params import SamplingParams


class ServingEngine(Protocol):
    # the model's tokenizer (prompts, and log-probabilities' token bytes)
    tokenizer: tokenizers.Tokenizer
    # the KV cache's size
    cache: CacheSpec

    def encode(self, prompt: str, add_special_tokens: bool = True) -> list[int]: ...

    def validate(self, prompt_ids: Sequence[int], params: SamplingParams) -> None: ...

    def add_request(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float | None = None,
    ) -> None: ...

    def abort_request(self, request_id: str) -> RequestOutput | None: ...

    def has_unfinished_requests(self) -> bool: ...

    def stats(self) -> EngineStats: ...

    def step(self) -> list[RequestOutput]: ...
