"""`platform run`: call a deployment and print its output."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from sdk._errors import JobFailed, StreamRestarted
from sdk._jobs import Stream
from sdk._sse import RunStatus
from sdk.cli import _common
from sdk.cli._format import bytes_progress, human_bytes
from sdk.cli._progress import Progress

# Inputs that are text by definition: never parsed as JSON (`prompt=42` is the prompt "42").
_TEXT_FIELDS = frozenset({"prompt"})


def parse_inputs(pairs: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs to a JobInput; a value is JSON when it parses as JSON, else a string.

    >>> parse_inputs(["prompt=Hi", "max_tokens=16", 'stop=["."]', "seed=null"])
    {'prompt': 'Hi', 'max_tokens': 16, 'stop': ['.'], 'seed': None}
    """
    result: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--input {pair!r}: expected key=value, e.g. --input prompt=Hello")
        if key in result:
            raise ValueError(f"--input {key}: given twice")
        if key in _TEXT_FIELDS:
            result[key] = raw
            continue
        try:
            result[key] = json.loads(raw)
        except json.JSONDecodeError:
            result[key] = raw
    return result


def run(
    deployment: Annotated[str, typer.Argument(help="Deployment name.", show_default=False)],
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            "-i",
            metavar="KEY=VALUE",
            help="An input field as key=value (repeatable); values that parse as JSON are JSON.",
            show_default=False,
        ),
    ] = None,
    stream: Annotated[
        bool, typer.Option("--stream", help="Print the text as it is generated.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole job as JSON.")] = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Seconds to wait for the result.")
    ] = None,
    detach: Annotated[
        bool,
        typer.Option("--detach", help="Queue an async job and print its id; do not wait."),
    ] = False,
) -> None:
    """Run a deployment on one input and print the generated text.

    \b
    Examples:
        platform run demo --input prompt="Once upon a time" --input max_tokens=32
        platform run demo -i prompt=Hi --stream
        platform run demo -i prompt=Hi -i 'stop=["\\n"]' --json
        JOB=$(platform run demo -i prompt=Hi --detach) && platform jobs watch "$JOB"
    """
    if not inputs:
        _common.fail("give the input, e.g. --input prompt=Hello")
    if stream and as_json:
        _common.fail("--stream and --json cannot be combined")
    if detach and stream:
        _common.fail("--detach and --stream cannot be combined")
    try:
        job_input = parse_inputs(inputs)
    except ValueError as e:
        _common.fail(str(e))

    with _common.client() as client:
        if detach:
            job = client.submit(deployment, job_input)
            if as_json:
                _common.print_json(job.raw)
            else:
                typer.echo(job.id)
        elif stream:
            with ColdStartBar() as bar:
                deltas = client.run(
                    deployment, job_input, stream=True, timeout=timeout, on_status=bar
                )
                _stream(deltas, bar)
        elif as_json:
            job = client.run(deployment, job_input, wait=False, timeout=timeout)
            try:
                job.wait(timeout=timeout)
            except JobFailed as e:
                _common.print_json(e.job.raw)
                raise
            _common.print_json(job.raw)
        elif sys.stderr.isatty():
            # Streamed under the hood so a cold start shows its progress; printed when done.
            with (
                ColdStartBar() as bar,
                client.run(
                    deployment, job_input, stream=True, timeout=timeout, on_status=bar
                ) as text,
            ):
                try:
                    whole = "".join(text)
                except StreamRestarted as e:  # nothing was printed yet: print the output
                    whole = e.job.text or ""
            typer.echo(whole)
        else:
            typer.echo(client.run(deployment, job_input, timeout=timeout))


def describe(status: RunStatus) -> tuple[str, str]:
    """What the bar says of a cold start, and the line a log gets (one per phase).

    >>> bar, line = describe(RunStatus("starting", "loading_weights", "loading_weights", 3.0,
    ...                                580_000_000, 1_160_000_000))
    >>> bar
    'Cold start: loading weights 0.58/1.16 GB, ready in ~3 s'
    >>> line
    'Cold start: loading weights (1.16 GB)'
    >>> describe(RunStatus("starting", "loading_weights", "loading_weights", None, 0, 612_000))[0]
    'Cold start: loading weights 0/612 KB'
    >>> describe(RunStatus("starting", "no_capacity", "waiting_for_node",
    ...                    detail="unschedulable: no node can take it: 0/2 nodes"))[0]
    'Cold start: waiting for a node: unschedulable: no node can take it: 0/2 nodes'
    """
    phase = status.phase or "booting"
    if phase == "waiting_for_node":
        why = f": {status.detail}" if status.detail else ""
        return f"Cold start: waiting for a node{why}", "Cold start: waiting for a node"
    eta = "" if status.eta_s is None else f", ready in ~{max(round(status.eta_s), 1)} s"
    if phase == "loading_weights" and status.bytes_total:
        done = bytes_progress(status.bytes_done or 0, status.bytes_total)
        return (
            f"Cold start: loading weights {done}{eta}",
            f"Cold start: loading weights ({human_bytes(status.bytes_total)})",
        )
    what = {
        "booting": "booting a worker",
        "assigning_warm_worker": "taking a warm worker",
        "warming": "warming up",
    }.get(phase, "loading weights")
    return f"Cold start: {what}{eta}", f"Cold start: {what}"


class ColdStartBar:
    """`on_status` of a streamed run: a bar on stderr while a worker boots for it, closed at
    the first other status (or by `close`, before any text is printed)."""

    def __init__(self) -> None:
        self._progress: Progress | None = None

    def __enter__(self) -> ColdStartBar:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __call__(self, status: RunStatus) -> None:
        if status.status != "starting" or status.phase is None:
            if status.status == "running":
                self.close()
            return
        if self._progress is None:
            self._progress = Progress(total=1, counts=False).__enter__()
        description, plain = describe(status)
        total = status.bytes_total or 1
        done = {
            "waiting_for_node": 0,
            "booting": 0,
            "assigning_warm_worker": 0,
            "warming": total,
        }.get(status.phase, status.bytes_done or 0)
        self._progress.update(description, completed=done, total=total, plain=plain)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
            self._progress = None


def _stream(deltas: Stream, bar: ColdStartBar) -> None:
    last = ""
    try:
        with deltas:
            for delta in deltas:
                bar.close()
                typer.echo(delta, nl=False)  # click.echo flushes: text appears as it comes
                last = delta
    except StreamRestarted as e:
        # what was printed cannot be taken back: say so, then print the job's whole output
        typer.echo()
        typer.echo(f"[job {e.job_id} was run again and its text changed; its output:]", err=True)
        typer.echo(e.job.text or "", nl=False)
        last = e.job.text or ""
    except KeyboardInterrupt:
        if deltas.job_id:
            typer.echo(f"\ninterrupted; the job goes on: {deltas.job_id}", err=True)
        raise typer.Exit(130) from None
    finally:
        if last and not last.endswith("\n"):
            typer.echo()
