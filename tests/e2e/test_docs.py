"""Every ```python and ```sh block of docs/sdk.md and docs/cli.md, run as written against the
live embedded platform (PLATFORM_URL / PLATFORM_API_KEY set, a deployment named `demo`).

Fence info words: `no-run` (shown, never run), `requires=/v1/path` (skipped while the
platform does not serve that endpoint), `file=NAME` (any language: the block is written to
NAME in the working directory before the blocks run, e.g. a manifest or a JSONL input).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sdk import Client
from tests.e2e.test_sdk_e2e import ensure_demo

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("docs/sdk.md", "docs/cli.md")
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    doc: str  # "docs/sdk.md"
    line: int  # 1-based line of the opening fence
    lang: str  # "python", "sh", "yaml", ...
    options: dict[str, str]  # {"no-run": "", "requires": "/v1/batches", "file": "x.jsonl"}
    code: str

    @property
    def id(self) -> str:
        return f"{Path(self.doc).name}:{self.line}"


def blocks(doc: str) -> list[Block]:
    text = (ROOT / doc).read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        lang, *words = m.group(1).split() or [""]
        options = dict(w.partition("=")[::2] for w in words)
        out.append(Block(doc, text.count("\n", 0, m.start()) + 1, lang, options, m.group(2)))
    return out


ALL = [b for doc in DOCS for b in blocks(doc)]
RUNNABLE = [b for b in ALL if b.lang in ("python", "sh") and "no-run" not in b.options]


def test_the_docs_have_runnable_blocks() -> None:
    assert {b.doc for b in RUNNABLE} == set(DOCS)
    assert all(b.lang in ("python", "sh", "yaml", "jsonl", "json", "") for b in ALL)


@pytest.fixture(scope="module")
def workdir(
    platform: dict[str, Any], demo_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, str]]:
    client = Client(base_url=platform["url"], api_key=platform["api_key"])
    ensure_demo(client, demo_model)
    # The docs deploy `store://models/demo/`, as the README's upload leaves it; deployments
    # check their model exists (services/models/model_check.py), so it must be there.
    client.files.upload_dir(demo_model, "models/demo/")
    client.close()
    cwd = tmp_path_factory.mktemp("docs")
    for block in ALL:
        if "file" in block.options:
            (cwd / block.options["file"]).write_text(block.code, encoding="utf-8")
    env = {
        **platform["env"],
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PLATFORM_CONFIG": str(cwd / "no-config.json"),
        "PYTHONPATH": str(ROOT),
    }
    return cwd, env


def served(platform: dict[str, Any], path: str) -> bool:
    """Whether the platform has the endpoint: an unknown route is a bare 404 "Not Found"."""
    r = httpx.get(
        platform["url"] + path,
        headers={"Authorization": f"Bearer {platform['api_key']}"},
        timeout=30,
    )
    return not (r.status_code == 404 and r.json().get("detail") == "Not Found")


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_doc_block_runs(
    block: Block, workdir: tuple[Path, dict[str, str]], platform: dict[str, Any]
) -> None:
    required = block.options.get("requires")
    if required and not served(platform, required):
        pytest.skip(f"the platform does not serve {required} yet")
    cwd, env = workdir
    if block.lang == "python":
        argv = [sys.executable, "-c", block.code]
    else:
        argv = ["bash", "-e", "-u", "-o", "pipefail", "-c", block.code]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (
        f"{block.id} exited {done.returncode}\n--- code\n{block.code}\n"
        f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )
