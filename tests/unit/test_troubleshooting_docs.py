"""docs/troubleshooting.md cites only what exists: every `platform …` command (and its flags)
in the CLI, every `/v1/…` path among the API's routes, every `platform_…` metric in
docs/observability.md."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer

from control_plane.api.app import create_app
from control_plane.settings import Settings
from sdk.cli.main import app as cli_app

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs/troubleshooting.md").read_text(encoding="utf-8")
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
# `platform` as a command: at the start of a code line or span, or after a shell separator.
COMMAND = re.compile(r"(?:^|[\s;|&(])platform\s+([^|;#)`\n]*)", re.MULTILINE)
API_PATH = re.compile(r"/v1/[A-Za-z0-9_{}.$…/-]*")
METRIC = re.compile(r"\bplatform_[a-z0-9_]+")
DOCUMENTED_METRIC = re.compile(r"^\| `(platform_[a-z0-9_]+)` \|", re.MULTILINE)


def commands() -> list[list[str]]:
    """Each cited command line after `platform`, as words (placeholders included): in fenced
    blocks wherever a command may start, in inline spans only at their start (a span may
    quote a message: "the platform already runs from …")."""
    lines = [line for block in FENCED.findall(DOC) for line in block.splitlines()]
    spans = [s for s in INLINE.findall(FENCED.sub("", DOC)) if s.startswith("platform ")]
    found = []
    for line in lines + spans:
        for m in COMMAND.finditer(line):
            words = m.group(1).replace("&&", " ").split()
            if words:
                found.append(words)
    return found


def resolve(words: list[str]) -> Any:
    """The CLI command the words name; fails unless it, and every option passed, exists.

    NOTE: typer may vendor click, so a group is told by its `commands`, not by its class."""
    root = typer.main.get_command(cli_app)
    command: Any = root
    options = {o for p in root.params for o in p.opts}
    rest = list(words)
    while hasattr(command, "commands") and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        sub = command.commands.get(name)
        assert sub is not None, f"`platform {' '.join(words)}`: no command {name!r}"
        command = sub
        options |= {o for p in command.params for o in p.opts}
    assert not hasattr(command, "commands"), f"`platform {' '.join(words)}`: incomplete"
    unknown = [
        w.partition("=")[0]
        for w in rest
        if w.startswith("-") and w.partition("=")[0] not in options | {"--help"}
    ]
    assert not unknown, f"`platform {' '.join(words)}`: no option {unknown}"
    return command


def test_the_doc_cites_commands() -> None:
    cited = {" ".join(w[:2]) for w in commands()}
    assert {"status", "jobs watch", "billing check", "usage --by"} <= cited


@pytest.mark.parametrize("words", commands(), ids=lambda w: " ".join(w[:3]))
def test_every_cited_command_exists(words: list[str]) -> None:
    resolve(words)


@pytest.fixture(scope="module")
def api_paths(tmp_path_factory: pytest.TempPathFactory) -> list[re.Pattern[str]]:
    """The API's `/v1` routes as patterns ({job_id} matches one segment, {path} any)."""
    db = tmp_path_factory.mktemp("db") / "routes.db"
    # Nothing connects while the app is built: no Redis or database is needed.
    settings = Settings(database_url=f"sqlite:///{db}", redis_url="redis://127.0.0.1:1/0")
    paths = create_app(settings).openapi()["paths"]
    patterns = []
    for path in paths:
        if path.startswith("/v1/"):
            regex = re.sub(r"\\\{path\\\}", ".+", re.escape(path))
            regex = re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", regex)
            patterns.append(re.compile(regex))
    assert len(patterns) > 20
    return patterns


def cited_paths() -> list[str]:
    return sorted({m.rstrip(".") for m in API_PATH.findall(DOC)})


def test_the_doc_cites_api_paths() -> None:
    assert "/v1/jobs/{id}/timeline" in cited_paths()


@pytest.mark.parametrize("path", cited_paths())
def test_every_cited_api_path_is_a_route(path: str, api_paths: list[re.Pattern[str]]) -> None:
    assert any(p.fullmatch(path) for p in api_paths), f"{path} is not a route of the API"


def test_every_cited_metric_is_documented() -> None:
    documented = set(
        DOCUMENTED_METRIC.findall((ROOT / "docs/observability.md").read_text(encoding="utf-8"))
    )
    cited = {re.sub(r"_(bucket|sum|count)$", "", m) for m in METRIC.findall(DOC)}
    assert cited, "the doc cites no metric"
    assert cited <= documented, f"not in docs/observability.md: {sorted(cited - documented)}"
