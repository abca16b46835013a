"""One request as the scheduler and the block manager see it: token ids and KV-cache state.

Pure Python (no torch). The model runner reads these objects to build a step's inputs.

NOTE: ``token_ids`` is prompt + generated tokens and only grows; ``num_computed_tokens`` of
them have their keys/values in the cache (in the blocks of ``block_table``). A preemption
drops the blocks and resets ``num_computed_tokens`` to 0, never the tokens. Under a sliding
window, leading ``block_table`` entries may be ``NULL_BLOCK`` (-1): blocks freed because no
future query reads them (``worker.engine.block_manager``).

Example:

    >>> seq = Sequence("req-1", [1, 15, 27], SamplingParams(max_tokens=8))
    >>> seq.num_tokens, seq.num_computed_tokens, seq.status
    (3, 0, <SequenceStatus.WAITING: 'waiting'>)
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence as SequenceABC

from worker.engine.params import SamplingParams

_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued, or preempted (its blocks freed)
    RUNNING = "running"  # holds blocks; scheduled every step while the budget allows
    FINISHED = "finished"  # done or aborted; its blocks are freed


class Sequence:
    """Mutable state of one request inside the engine."""

    __slots__ = (
        "arrival_time",
        "block_hashes",
        "block_table",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "order",
        "params",
        "priority",
        "request_id",
        "status",
        "token_ids",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: SequenceABC[int],
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float = 0.0,
    ) -> None:
        # caller's id, unique among live requests
        self.request_id = request_id
        # prompt then generated tokens
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params
        # scheduling class: lower is served first (0 sync, then async, then batch)
        self.priority = priority
        # when the request entered the engine (the engine's clock)
        self.arrival_time = arrival_time
        # FCFS tie-break between requests with the same priority and arrival time
        self.order = next(_counter)
        self.status = SequenceStatus.WAITING
        # tokens whose keys/values are in the cache
        self.num_computed_tokens = 0
        # prompt tokens found in the prefix cache at first admission (-1: not admitted yet)
        self.num_cached_tokens = -1
        # physical KV block of each logical block (block i holds tokens [i*bs, (i+1)*bs)), or
        # NULL_BLOCK (-1) for a leading block freed out of the sliding window
        self.block_table: list[int] = []
        # chained hash of each full block of token_ids (filled lazily by the block manager)
        self.block_hashes: list[bytes] = []
        self.num_preemptions = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def sort_key(self) -> tuple[int, float, int]:
        """Scheduling order: priority class, then first come first served."""
        return (self.priority, self.arrival_time, self.order)

    def __repr__(self) -> str:
        # NOTE: no token ids: they are the user's prompt (STYLE 15)
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )
