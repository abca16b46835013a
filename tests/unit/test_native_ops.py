"""RMSNorm and rotary embeddings in C (worker/model/csrc/elementwise.c) against torch's: the
rotary embedding bit for bit, RMSNorm within float rounding (and with the residual sum before
it, the sum then the same norm); small and large row counts (the
kernels go parallel from 64 rows), widths that are not a multiple of 8, one and two threads;
and the model's modules using them only once attached, and only where they apply; greedy
sampling's argmax against torch's max(dim=-1): ties, NaN, rows banned entirely, tails; SwiGLU's
silu(gate) * up within float rounding of torch's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from common.model_config import ModelConfig
from worker.model import native_ops
from worker.model.llama import _apply_rope


@pytest.fixture(scope="module")
def ops() -> native_ops.RowOps:
    loaded = native_ops.load()
    assert loaded is not None, "this machine has a C compiler: the kernels must build"
    return loaded


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize(("rows", "hidden"), [(1, 512), (33, 36), (300, 512), (70, 4100)])
def test_rms_norm_matches_torch(
    ops: native_ops.RowOps, threads: int, rows: int, hidden: int
) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, hidden, generator=gen) * 3
    weight = torch.randn(hidden, generator=gen)
    got = ops.rms_norm(x, weight, 1e-6)
    want = F.rms_norm(x, (hidden,), weight, 1e-6)
    assert got.shape == want.shape
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("rows", "hidden"), [(1, 512), (33, 36), (300, 512)])
def test_add_rms_norm_is_the_sum_then_the_norm(
    ops: native_ops.RowOps, threads: int, rows: int, hidden: int
) -> None:
    gen = torch.Generator().manual_seed(rows)
    branch, residual = torch.randn(2, rows, hidden, generator=gen).unbind()
    weight = torch.randn(hidden, generator=gen)
    total = branch + residual
    out = ops.add_rms_norm_(branch, residual, weight, 1e-6)
    # the sum lands in residual bit for bit; the norm is rms_norm's of it, bit for bit
    assert torch.equal(residual, total)
    assert torch.equal(out, ops.rms_norm(total, weight, 1e-6))


@pytest.mark.parametrize(
    ("tokens", "heads", "kv_heads", "head_dim"), [(1, 8, 2, 64), (100, 4, 1, 12)]
)
def test_rope_matches_torch_bit_for_bit(
    ops: native_ops.RowOps, threads: int, tokens: int, heads: int, kv_heads: int, head_dim: int
) -> None:
    gen = torch.Generator().manual_seed(tokens)
    # a fused q|k|v projection: rotate the q and k heads, leave v alone
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    angles = torch.rand(tokens, head_dim // 2, generator=gen) * 100
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    rotated = heads + kv_heads
    qk = qkv[:, : rotated * head_dim].view(tokens, rotated, head_dim)
    want = _apply_rope(qk, cos.unsqueeze(-2), sin.unsqueeze(-2))
    values = qkv[:, rotated * head_dim :].clone()
    ops.rope_(qkv, rotated, cos, sin)
    assert torch.equal(qkv[:, : rotated * head_dim].view(tokens, rotated, head_dim), want)
    assert torch.equal(qkv[:, rotated * head_dim :], values)


def test_modules_use_the_kernels_once_attached_and_only_where_they_apply(
    ops: native_ops.RowOps,
) -> None:
    from worker.model.demo import init_model

    config = ModelConfig.from_hf_dict(
        {
            "model_type": "llama",
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 64,
        }
    )
    model = init_model(config, torch.Generator().manual_seed(0)).eval()
    # per layer its two RMSNorms, its attention and its MLP, then the final norm
    assert native_ops.attach(model, ops) == 2 * 4 + 1
    norm = model.model.norm
    x = torch.randn(5, 32)
    with torch.inference_mode():
        assert torch.equal(norm(x), ops.rms_norm(x, norm.weight, norm.eps))
        # bf16 is not the kernels': torch's maths
        assert not ops.takes(x.bfloat16())
        assert torch.allclose(norm(x.bfloat16()).float(), norm(x), atol=0.1)
        ids = torch.tensor([[1, 2, 3, 4]])
        attached = model.forward_all(ids)
        native_ops.attach(model, None)
        assert norm.native is None
        detached = model.forward_all(ids)
    assert torch.allclose(attached, detached, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("rows", "width"), [(1, 8), (3, 37), (32, 1536), (64, 1536)])
def test_silu_mul_matches_torch(
    ops: native_ops.RowOps, threads: int, rows: int, width: int
) -> None:
    gen = torch.Generator().manual_seed(rows + width)
    # wide-ranging inputs: e^-|x| from 1 down to below float's normal range
    gate_up = torch.randn(rows, 2 * width, generator=gen) * 30
    gate_up[0, :3] = torch.tensor([0.0, -100.0, 100.0])[: min(3, width)]
    gate, up = torch.split(gate_up, width, dim=-1)
    want = F.silu(gate) * up
    got = ops.silu_mul(gate_up, width)
    assert got.shape == (rows, width)
    assert torch.allclose(got, want, rtol=2e-6, atol=1e-30)


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (3, 31), (6, 32), (7, 100), (32, 32000)])
def test_argmax_matches_torch_max(ops: native_ops.RowOps, rows: int, cols: int) -> None:
    gen = torch.Generator().manual_seed(rows * cols)
    # few distinct values: ties everywhere (the first maximum wins), in every lane and tail
    x = torch.randint(0, 5, (rows, cols + 3), generator=gen).float()[:, 3:]
    if rows >= 6:
        x[1, cols // 2] = float("nan")  # NaN is the greatest: its first index
        x[2] = float("-inf")  # a row a structured output banned entirely: index 0
        x[3, -1] = x[3, cols // 3] = float("nan")
        x[4, -1] = 9.0  # the maximum in the tail past the last whole vector
        x[5, 0] = 9.0
    assert x.stride(0) == cols + 3  # rows apart
    assert ops.argmax(x) == x.max(dim=-1).indices.tolist()
