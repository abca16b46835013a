"""Every command and subcommand has help text with an example of itself."""

from __future__ import annotations

import pytest

from tests.unit.cli.mock_api import invoke


def _commands() -> list[list[str]]:
    import typer.main

    from sdk.cli.main import app

    group = typer.main.get_command(app)
    out = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        subcommands = getattr(command, "commands", None)
        if subcommands:
            out += [[name, sub] for sub in subcommands]
        else:
            out.append([name])
    return out


@pytest.mark.parametrize("path", _commands(), ids=" ".join)
def test_every_command_has_help_with_an_example(path: list[str]) -> None:
    result = invoke([*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.stdout and f"platform {' '.join(path)}" in result.stdout
