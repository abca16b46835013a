"""The requests each system runs: the Azure conversation trace scaled to the machine (`Scale`,
`SCALES`), multi-turn conversations from the Mooncake trace whose turns share prompt prefixes
(for prefix caching), and the cold request run first. Standard library only (the vLLM runner
imports it from vLLM's own virtualenv)."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

from bench.traces import WORKLOADS, clip, read_trace

PREFIX_BLOCK_TOKENS = 8  # one 512-token Mooncake block
# The cold request every system runs first, timed from its process's start: 64 tokens (no
# workload prompt starts with them: those are drawn at random), one token generated.
COLD_PROMPT = list(range(1, 65))
PREFIX_WINDOW = 3000  # conversations are picked among the trace's first requests


@dataclass(frozen=True, slots=True)
class Scale:
    """How trace lengths map to this machine."""

    prompt_div: float
    prompt_min: int
    prompt_max: int
    output_div: float
    output_min: int
    output_max: int

    def describe(self) -> str:
        return (
            f"prompt = ctx/{self.prompt_div:g} clipped to {self.prompt_min}..{self.prompt_max}, "
            f"output = gen/{self.output_div:g} clipped to {self.output_min}..{self.output_max}"
        )


# Trace lengths per machine: CPU runs are scaled down, a GPU takes the trace nearly as is.
SCALES = {
    "quick": Scale(32, 8, 64, 8, 4, 16),
    "cpu": Scale(8, 16, 512, 2, 16, 256),
    "gpu": Scale(1, 16, 2048, 1, 16, 512),
}


def azure_workload(
    n: int, scale: Scale, vocab_size: int, seed: int = 0
) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    out = []
    for r in read_trace(WORKLOADS / "azure_llm_2023_conv.csv", limit=n):
        num_prompt = clip(r.prompt_tokens / scale.prompt_div, scale.prompt_min, scale.prompt_max)
        num_out = clip(r.output_tokens / scale.output_div, scale.output_min, scale.output_max)
        out.append(([rng.randrange(1, vocab_size) for _ in range(num_prompt)], num_out))
    return out


def prefix_workload(
    n: int, vocab_size: int, max_prompt: int, output_tokens: int
) -> tuple[list[tuple[list[int], int]], str]:
    """Multi-turn conversations from the Mooncake trace: the turns (in arrival order) of its
    longest conversations among the first PREFIX_WINDOW requests, ``n`` requests in all. A
    hash id becomes PREFIX_BLOCK_TOKENS fixed pseudo-random tokens, so requests sharing hash
    ids share prompt prefixes. Returns the workload and a description of it."""
    trace = read_trace(WORKLOADS / "mooncake_conversation.jsonl", limit=PREFIX_WINDOW)
    conversations: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, r in enumerate(trace):
        # the first block is a shared system prompt; the second names the conversation
        conversations[r.hash_ids[:2]].append(i)
    picked: list[int] = []
    chosen = sorted(conversations.values(), key=len, reverse=True)
    for turns in chosen:
        picked += turns[: n - len(picked)]
        if len(picked) == n:
            break
    out = []
    for i in sorted(picked):
        tokens: list[int] = []
        for h in trace[i].hash_ids:
            block_rng = random.Random(h)
            tokens += [block_rng.randrange(1, vocab_size) for _ in range(PREFIX_BLOCK_TOKENS)]
        out.append((tokens[:max_prompt] or [1], output_tokens))
    num_conversations = len({trace[i].hash_ids[:2] for i in picked})
    what = (
        f"{len(out)} requests = the turns of the {num_conversations} longest conversations "
        f"among the first {PREFIX_WINDOW} of mooncake_conversation.jsonl; a hash id = "
        f"{PREFIX_BLOCK_TOKENS} tokens, prompts <= {max_prompt} tokens, {output_tokens} output "
        f"tokens each; {sum(len(p) for p, _ in out)} prompt tokens"
    )
    return out, what
