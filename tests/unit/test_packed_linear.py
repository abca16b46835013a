"""oneDNN-packed linear layers (worker.model.packed_linear): the same outputs as nn.Linear at
every row count, in place and idempotent, nothing opaque in the state dict, a tied head's
embedding untouched. Token equality with transformers once packed: the differential tests
(the runner packs after an engine's first step)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from worker.model import packed_linear
from worker.model.packed_linear import PackedLinear, can_pack, onednn_bf16, pack_linears

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="needs torch built with oneDNN"
)


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 24, bias=True)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight


@pytest.mark.parametrize("rows", [1, 3, 32, 257])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_matches_linear_at_every_row_count(rows: int, dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and not onednn_bf16():
        pytest.skip("this CPU has no oneDNN bf16 path (pack_linears keeps F.linear for bf16)")
    torch.manual_seed(0)
    linear = nn.Linear(64, 96, bias=True).to(dtype)
    x = torch.randn(rows, 64, dtype=dtype)
    with torch.no_grad():
        expected = linear(x)
        got = PackedLinear(linear.weight, linear.bias)(x)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


def test_pack_linears_is_in_place_idempotent_and_keeps_the_embedding() -> None:
    torch.manual_seed(0)
    model = _Tied().requires_grad_(False)
    ids = torch.tensor([1, 7, 42])
    with torch.no_grad():
        expected = model.head(model.proj(model.embed(ids))[:, :16])
    embedding = model.embed.weight.clone()

    assert pack_linears(model) == 2
    assert isinstance(model.proj, PackedLinear) and isinstance(model.head, PackedLinear)
    assert pack_linears(model) == 0  # nothing left to pack
    with torch.no_grad():
        got = model.head(model.proj(model.embed(ids))[:, :16])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(model.embed.weight, embedding)
    # the opaque weights are no parameters or buffers: the state dict stays plain
    assert set(model.state_dict()) == {"embed.weight", "proj.bias"}


def test_only_cpu_float_weights_are_packed() -> None:
    assert can_pack(torch.empty(4, 4))
    assert can_pack(torch.empty(4, 4, dtype=torch.bfloat16)) == onednn_bf16()
    assert not can_pack(torch.empty(4, 4, dtype=torch.float64))
    assert not can_pack(torch.empty(4, 4, device="meta"))


def test_a_bf16_model_keeps_plain_linears_where_onednn_has_no_bf16_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # oneDNN's bf16 reorder raises on a CPU without AVX-512 BW/VL/DQ or AVX-NE-CONVERT: there a
    # bf16 model keeps F.linear, and an fp32 one is still packed
    monkeypatch.setattr(packed_linear, "onednn_bf16", lambda: False)
    bf16 = nn.Sequential(nn.Linear(16, 8)).to(torch.bfloat16).requires_grad_(False)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    expected = bf16(x)
    assert pack_linears(bf16) == 0
    assert type(bf16[0]) is nn.Linear
    torch.testing.assert_close(bf16(x), expected)
    assert pack_linears(nn.Sequential(nn.Linear(16, 8))) == 1
