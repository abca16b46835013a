"""A checkpoint's small files (config, tokenizer, generation and chat settings) in a local
directory: what vLLM reads by path to build its config and tokenizer. The weights are not
among them: they stream through the platform's loader (model_loader.py).

Read with the worker's `ObjectStore` (the deploying tenant's storage credentials, nothing
else), concurrently; a file the checkpoint lacks is simply absent.
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from loader import ObjectStore, join_uri

# What transformers and vLLM read from a model directory besides the weights.
SMALL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
REQUIRED = ("config.json", "tokenizer.json")


def fetch_small_files(store: ObjectStore, model_uri: str, parent: str | None = None) -> Path:
    """A new local directory holding the checkpoint's small files (`parent`: where it is
    made; default the system's temporary directory). Raises the loader's error when a
    required file is missing or unreadable; then nothing is left behind."""
    target = Path(tempfile.mkdtemp(prefix="platform-vllm-model-", dir=parent))
    try:
        with ThreadPoolExecutor(max_workers=6, thread_name_prefix="model-files") as pool:
            found = dict(
                zip(
                    SMALL_FILES,
                    pool.map(
                        lambda name: _read(store, model_uri, name, name in REQUIRED), SMALL_FILES
                    ),
                    strict=True,
                )
            )
        for name, data in found.items():
            if data is not None:
                (target / name).write_bytes(data)
        if not (target / "tokenizer_config.json").exists():
            # transformers needs a class for a bare tokenizer.json
            (target / "tokenizer_config.json").write_text(
                '{"tokenizer_class": "PreTrainedTokenizerFast"}'
            )
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return target


def _read(store: ObjectStore, model_uri: str, name: str, required: bool) -> bytes | None:
    uri = join_uri(model_uri, name)
    return store.read_bytes(uri) if required else store.read_if_exists(uri)
