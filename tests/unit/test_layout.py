"""The layout the architecture promises (docs/architecture.md "Layout"), checked on the source:
which package may import which, no import cycle in the control plane (imports inside functions
and under TYPE_CHECKING count too), and no module past 400 lines outside generated files and
migrations."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.tools import unasync

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "control_plane", "worker", "loader", "sdk")
MAX_LINES = 400
# Generated from their asyncio twins (the size rule holds for those), and Alembic's migrations.
GENERATED = set(unasync.PAIRS.values())


def modules(package: str) -> dict[str, Path]:
    out = {}
    for path in (ROOT / package).rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        out[name] = path
    return out


def imports(path: Path, name: str) -> set[str]:
    """Every module `path` imports, wherever the import statement is."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def test_each_package_imports_only_what_it_may() -> None:
    """The worker never imports the control plane nor the control plane the worker; both share
    `common`, which imports neither; the SDK and the loader import no other package of ours."""
    may_not = {
        "common": ("control_plane", "worker", "loader", "sdk"),
        # vLLM lives in an environment of its own; the control plane reads what it serves as
        # data (control_plane/domain/vllm_support.py)
        "control_plane": ("worker", "vllm"),
        "worker": ("control_plane", "sdk"),
        "loader": ("control_plane", "worker", "common", "sdk"),
        "sdk": ("control_plane", "worker", "loader", "common"),
    }
    wrong = []
    for package, forbidden in may_not.items():
        for name, path in modules(package).items():
            for imported in imports(path, name):
                if imported.split(".")[0] in forbidden:
                    wrong.append(f"{name} imports {imported}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_control_plane_has_no_import_cycle() -> None:
    mods = modules("control_plane")

    def resolve(imported: str) -> str | None:
        while imported and imported not in mods:
            imported = imported.rpartition(".")[0]
        return imported or None

    edges = {
        name: {m for i in imports(path, name) if (m := resolve(i)) not in (None, name)}
        for name, path in mods.items()
        if "migrations" not in path.parts
    }
    # a depth-first search that reports the first cycle it meets
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            assert cycle is None, " → ".join(cycle)


@pytest.mark.parametrize("package", [*PACKAGES, "bench", "tests", "infra"])
def test_no_module_is_past_the_size_a_reader_takes_in(package: str) -> None:
    long = []
    for path in (ROOT / package).rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel in GENERATED or "migrations/versions" in rel:
            continue
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            long.append(f"{rel}: {lines} lines")
    assert not long, "split by what each part acts on:\n" + "\n".join(long)
