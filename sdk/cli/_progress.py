"""Progress of something the CLI waits for: a rich bar on a terminal, plain lines when piped.

Both go to stderr, so stdout keeps only the command's result (and `--json` stays parseable).
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID


class Progress:
    """`with Progress(total=4) as p: p.update("loading", completed=2)`.

    On a terminal: one live bar with the latest description. Piped: one line per change of
    description, so a log shows every step once.
    """

    def __init__(self, total: int, *, tty: bool | None = None, counts: bool = True) -> None:
        self._total = total
        self._tty = sys.stderr.isatty() if tty is None else tty
        self._counts = counts  # show "done/total" next to the bar
        self._last: str | None = None
        self._rich: RichProgress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Progress:
        if self._tty:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._rich = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                *([MofNCompleteColumn()] if self._counts else []),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._rich.__enter__()
            self._task = self._rich.add_task("", total=self._total)
        return self

    def update(
        self, description: str, completed: int, total: int | None = None, plain: str | None = None
    ) -> None:
        """`plain`: the line a log gets instead of `description` (one per change of it)."""
        if total is not None:
            self._total = total
        if self._rich is not None and self._task is not None:
            self._rich.update(
                self._task, description=description, completed=completed, total=self._total
            )
            return
        line = description if plain is None else plain
        if line != self._last:
            typer.echo(line, err=True)
        self._last = line

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._rich is not None:
            self._rich.__exit__(exc_type, exc, tb)
