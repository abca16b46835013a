"""yamllint over infra/: the YAML files as written, and the chart's templates as rendered
(Go templates are not YAML until Helm has run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from yamllint import linter
from yamllint.config import YamlLintConfig

from tests.infra.chart import INFRA, VARIANTS, render

CONFIG = YamlLintConfig(file=str(INFRA / ".yamllint"))


def _problems(text: str, path: str) -> list[str]:
    return [f"{path}:{p.line}:{p.column} {p.desc} ({p.rule})" for p in linter.run(text, CONFIG)]


def yaml_files() -> list[Path]:
    files = sorted({*INFRA.rglob("*.yaml"), *INFRA.rglob("*.yml")})
    return [f for f in files if not CONFIG.is_file_ignored(str(f.relative_to(INFRA)))]


def test_the_lint_covers_compose_and_the_charts_own_files() -> None:
    names = {f.relative_to(INFRA).as_posix() for f in yaml_files()}
    assert {"compose/compose.yaml", "helm/platform/values.yaml", "helm/platform/Chart.yaml"} <= (
        names
    )
    assert not [n for n in names if "/templates/" in n]


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: p.relative_to(INFRA).as_posix())
def test_yaml_files_pass_yamllint(path: Path) -> None:
    assert _problems(path.read_text(), str(path)) == []


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_chart_passes_yamllint(variant: str) -> None:
    problems = []
    for r in render(VARIANTS[variant]):
        # Helm trims each manifest before it writes or applies it (releaseutil.SplitManifests);
        # lint that, not the whitespace template directives leave around it.
        problems += _problems(r.text.strip() + "\n", r.template)
    assert problems == []


def test_yamllint_finds_problems() -> None:
    """The config is not so loose that it passes anything."""
    assert _problems("a: 1\na: 2\nb:   [ x ]\n", "bad.yaml")
