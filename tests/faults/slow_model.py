"""A checkpoint that is slow enough to start for a fault to land inside its cold start.

The demo model loads in ~0.05 s and warms up in ~0.01 s: a worker is in `loading` or
`warming` too briefly to be found there and killed. This one keeps the demo's tokenizer and
files but is a wider and deeper random Llama (1024 wide, 8 layers: ~380 MB of float32), so a
load takes a few tenths of a second and the warm-up (memory-bound: it reads every weight) tens
of milliseconds on a 2-core CPU. Nothing in the product is slowed down for the test.

    python -m tests.faults.slow_model OUT_DIR     # or build_slow_model(out) from a test

Built in a subprocess: torch stays out of pytest's process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HIDDEN_SIZE = 1024
NUM_LAYERS = 8
HEAD_DIM = 64


def build_slow_model(out: Path) -> Path:
    """The checkpoint written to `out` (about 5 s)."""
    subprocess.run(
        [sys.executable, "-m", "tests.faults.slow_model", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def _write(out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from common.model_config import ModelConfig
    from worker.model.demo import create_demo_model, init_model
    from worker.model.weights import hf_state_dict

    create_demo_model(out, train_steps=0)  # tokenizer and the small files
    config = json.loads((out / "config.json").read_text())
    config.update(
        hidden_size=HIDDEN_SIZE,
        intermediate_size=HIDDEN_SIZE * 11 // 4,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=HIDDEN_SIZE // HEAD_DIM,
        num_key_value_heads=HIDDEN_SIZE // (2 * HEAD_DIM),
        head_dim=HEAD_DIM,
    )
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model = init_model(ModelConfig.from_hf_dict(config), torch.Generator().manual_seed(0))
    save_file(hf_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    _write(Path(sys.argv[1]))
