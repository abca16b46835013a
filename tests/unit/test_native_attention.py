"""The CPU decode-attention kernel (worker/model/csrc/paged_decode.c) against the torch
reference: MHA/GQA/MQA, head sizes, sliding windows with blocks freed out of the window (a NaN
null block it must never read), queries that are views of a fused projection, one and two
threads; its store of a step's keys and values against store_kv_ref; the whole engine on it
against the torch path; its build cache shared by processes;
and the fallback where it cannot be built (for every CPU kernel).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# one and two intra-op threads (the kernels split their work on torch's OpenMP threads)
from tests.unit.test_native_ops import threads  # noqa: F401
from worker.model import native_attention
from worker.model.attention import paged_attention_ref, store_kv_ref
from worker.model.runner import resolve_backend

ROOT = Path(__file__).resolve().parents[2]
BLOCK_SIZE = 16

# name -> (num_heads, num_kv_heads, head_dim, window, seq_lens)
CASES: dict[str, tuple[int, int, int, int | None, list[int]]] = {
    "mha": (2, 2, 16, None, [1, 17, 40, 16]),
    "gqa_head64": (8, 2, 64, None, [300, 129, 5, 64]),
    "mqa_odd_head": (4, 1, 12, None, [33, 1, 90]),
    "gqa_head128_long": (4, 2, 128, None, [1000, 2]),
    "sliding_window": (4, 2, 16, 20, [70, 50, 21, 3]),
    # query heads go four at a time: a group of 3, and one of 10 (4 + 4 + 2), head 40 (32 + 8)
    "group_of_3": (6, 2, 32, None, [77, 3]),
    "group_of_10": (10, 1, 40, None, [130, 16, 1]),
}


@pytest.fixture(scope="module")
def kernel() -> native_attention.DecodeKernel:
    built = native_attention.load()
    assert built is not None, "this machine has a C compiler: the kernel must build"
    return built


def paged_caches(
    num_kv_heads: int,
    head_dim: int,
    seqs: list[tuple[int, int]],
    window: int | None,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k and v caches with shuffled blocks and a NaN null block, and int32 block tables for
    ``seqs`` (new tokens, cached after the step): the blocks BlockManager frees (wholly before
    the first new token's window) and the padding point at the null block."""
    num_blocks = sum(-(-n // BLOCK_SIZE) for _, n in seqs)
    null = num_blocks
    shape = (num_blocks + 1, BLOCK_SIZE, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(-(-n // BLOCK_SIZE) for _, n in seqs)
    tables = []
    for new, n in seqs:
        table = [free.pop() for _ in range(-(-n // BLOCK_SIZE))]
        first_visible = 0 if window is None else max(n - new - window + 1, 0)
        num_freed = first_visible // BLOCK_SIZE
        tables.append([null] * num_freed + table[num_freed:] + [null] * (max_blocks - len(table)))
    # the null block: never to be read (NaN would leak through p @ v)
    k_cache[null], v_cache[null] = float("nan"), float("nan")
    return k_cache, v_cache, torch.tensor(tables, dtype=torch.int32)


def _case(
    name: str, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Paged caches (one new token per sequence) and queries as a view of a wider projection."""
    num_heads, num_kv_heads, head_dim, window, lens = CASES[name]
    k_cache, v_cache, tables = paged_caches(
        num_kv_heads, head_dim, [(1, n) for n in lens], window, gen
    )
    # q: [n, Hq, D], a view of [n, (Hq + Hkv), D] as the fused projection gives
    fused = torch.randn(len(lens), num_heads + num_kv_heads, head_dim, generator=gen)
    q = fused[:, :num_heads]
    return q, k_cache, v_cache, tables, torch.tensor(lens), lens


def _reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    lens: list[int],
    window: int | None,
) -> torch.Tensor:
    # the reference reads every block it is given, masked or not: zeros in the null block
    k_ref, v_ref = k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0)
    starts = list(range(len(lens) + 1))
    scale = q.shape[-1] ** -0.5
    return paged_attention_ref(q, k_ref, v_ref, starts, lens, tables, scale, window)


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("name", list(CASES))
def test_decode_kernel_matches_reference(kernel: native_attention.DecodeKernel, name: str) -> None:
    gen = torch.Generator().manual_seed(len(name))
    q, k_cache, v_cache, tables, lens_t, lens = _case(name, gen)
    window = CASES[name][3]
    assert kernel.supports(q, k_cache) and not q.is_contiguous()
    out = torch.full(q.shape, float("nan"))
    scale = q.shape[-1] ** -0.5
    kernel.decode(q, k_cache, v_cache, tables, lens_t.to(torch.int32), scale, window, out)
    ref = _reference(q, k_cache, v_cache, tables, lens, window)
    assert torch.isfinite(out).all()
    assert float((out - ref).abs().max()) <= 1e-5


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("tokens", [5, 300])  # the copy goes parallel from 256 tokens
def test_store_writes_what_store_kv_ref_writes(
    kernel: native_attention.DecodeKernel, tokens: int
) -> None:
    gen = torch.Generator().manual_seed(tokens)
    # k, v: views of a fused projection [tokens, (Hq + 2 Hkv) * D] with Hq 4, Hkv 2, D 16
    fused = torch.randn(tokens, 8, 16, generator=gen)
    k, v = fused[:, 4:6], fused[:, 6:]
    slots = torch.randperm(40 * BLOCK_SIZE, generator=gen)[:tokens]
    slots[::7] = -1  # skipped
    caches = [torch.randn(40, BLOCK_SIZE, 2, 16, generator=gen) for _ in range(2)]
    want = [c.clone() for c in caches]
    store_kv_ref(k, v, *want, slots)
    kernel.store(k, v, *caches, slots)
    assert torch.equal(caches[0], want[0]) and torch.equal(caches[1], want[1])


def test_kernel_is_used_only_where_it_applies(kernel: native_attention.DecodeKernel) -> None:
    cpu = torch.device("cpu")
    q = torch.zeros(2, 4, 16)
    cache = torch.zeros(3, BLOCK_SIZE, 2, 16)
    assert kernel.supports(q, cache)
    assert not kernel.supports(q.to(torch.bfloat16), cache.to(torch.bfloat16))
    assert not kernel.supports(q.transpose(1, 2), cache)  # heads not contiguous
    assert resolve_backend("auto", cpu) == "cpu"
    assert resolve_backend("cpu", cpu) == "cpu"
    assert resolve_backend("torch", cpu) == "torch"
    # bf16 models on CPU keep torch's path; asking for the kernel there is an error
    assert resolve_backend("auto", cpu, torch.bfloat16) == "torch"
    with pytest.raises(ValueError, match="'cpu' needs a float32 model on CPU"):
        resolve_backend("cpu", cpu, torch.bfloat16)


@pytest.mark.parametrize("window", [None, 16], ids=["llama", "mistral_window"])
def test_engine_on_the_kernel_matches_torch_path(window: int | None) -> None:
    from tests.unit.test_kernels import _engine_tokens

    on_kernel = _engine_tokens("cpu", "cpu", window=window)
    on_torch = _engine_tokens("cpu", "torch", window=window)
    assert on_kernel == on_torch
    assert all(len(t) == (4 if window is None else 40) for t in on_torch)


_CHILD = (
    "import json, os, torch; from worker.model import native_attention as a, native_ops as o; "
    "ok = [k is not None for k in (a.load(), a.load_prefill(), o.load())]; "
    "d = a.LIBRARY.path('cc').parent; "
    # loading them leaves the process's floating point alone (no flush-to-zero: subnormals stay)
    "assert 5e-324 * 1.0 != 0.0 and float(torch.tensor([1e-40]) * 1.0) != 0.0; "
    "print(json.dumps([ok, sorted((p.name, p.stat().st_mtime_ns) for p in d.iterdir())]))"
)


def _child(env: dict[str, str]) -> list[object]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, cwd=ROOT, capture_output=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: list[object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_a_second_process_reuses_the_built_kernels(tmp_path: Path) -> None:
    env = {**os.environ, "PLATFORM_ENGINE_KERNEL_CACHE_DIR": str(tmp_path)}
    env.pop("CC", None)
    first = _child(env)
    # every kernel built, nothing else left in the cache directory
    assert first[0] == [True, True, True]
    names = [name.split("-")[0] for name, _ in first[1]]
    assert names == ["elementwise", "paged_decode", "paged_prefill"]
    # no compiler on PATH now: the second process can only load what the first built
    no_compiler = {**env, "PATH": str(tmp_path / "empty")}
    assert _child(no_compiler) == first


@pytest.mark.parametrize(
    ("compiler", "reason"),
    [("/nonexistent/cc", "no C compiler"), ("false", "failed")],
    ids=["missing", "failing"],
)
def test_without_the_kernels_the_engine_keeps_torch_path(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    compiler: str,
    reason: str,
) -> None:
    from worker.model import native_ops

    monkeypatch.setenv("PLATFORM_ENGINE_KERNEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", compiler)
    libraries = (native_attention.LIBRARY, native_attention.PREFILL_LIBRARY, native_ops.LIBRARY)
    for library in libraries:
        library.forget()
    try:
        assert native_attention.load() is None and native_ops.load() is None
        assert native_attention.load_prefill() is None
        assert reason in caplog.text
        cpu = torch.device("cpu")
        assert resolve_backend("auto", cpu) == "torch"
        with pytest.raises(ValueError, match="needs a float32 model on CPU and a C compiler"):
            resolve_backend("cpu", cpu)
        assert list(tmp_path.iterdir()) == []  # no half-built file left behind
    finally:
        for library in libraries:
            library.forget()
