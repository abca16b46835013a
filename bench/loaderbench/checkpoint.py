"""What every load reads: a Llama-shaped bf16 checkpoint (`SHAPES`) behind `rclone serve s3`
on loopback, and the machine line each table starts with."""

from __future__ import annotations

import argparse
import os
import platform
import secrets
from pathlib import Path
from typing import Any

BUCKET = "models"
KEY = "bench-llama/model.safetensors"


# (hidden, kv width, MLP, vocab, layers) per shape
SHAPES = {
    "small": (2048, 512, 5632, 32000, 10),  # a small Llama: 10 layers ≈ 1.16 GB
    "8b": (4096, 1024, 14336, 128256, 32),  # Llama-3-8B: ≈ 16.1 GB
}


def make_checkpoint(path: Path, shape: str, layers: int | None) -> int:
    """A Llama-shaped bf16 checkpoint (GQA 4:1) of the given shape."""
    import torch
    from safetensors.torch import save_file

    hidden, kv, mlp, vocab, default_layers = SHAPES[shape]
    layers = default_layers if layers is None else layers
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (mlp, hidden),
            p + "mlp.up_proj.weight": (mlp, hidden),
            p + "mlp.down_proj.weight": (hidden, mlp),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for n, s in shapes.items():
        t = torch.empty(s, dtype=torch.bfloat16)
        # cheap, non-constant content: a random row repeated
        t.view(-1, s[-1])[:] = torch.randn(s[-1], generator=g).bfloat16()
        tensors[n] = t
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path.stat().st_size


def serve_checkpoint(root: Path, args: argparse.Namespace) -> tuple[int, Any, dict[str, str]]:
    """The bench checkpoint behind `rclone serve s3` in `root`: its size, the server, and the
    environment that points a client at it."""
    from control_plane.embedded.processes import free_port, start_s3

    size = make_checkpoint(root / "objects" / BUCKET / KEY, args.shape, args.layers)
    access, secret = "AKBENCH" + secrets.token_hex(8).upper(), secrets.token_urlsafe(24)
    server = start_s3(root / "objects", free_port(), access, secret, root / "rclone.log", (BUCKET,))
    env = {
        "AWS_ENDPOINT_URL": server.extra["url"],
        "AWS_ACCESS_KEY_ID": access,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return size, server, env


def machine() -> str:
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores {cpu}, {mem_gb:.0f} GiB RAM, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )
