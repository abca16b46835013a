"""The `platform` command: builds the typer app from the noun modules and maps exit codes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from sdk._errors import PlatformError
from sdk.cli import (
    _common,
    batch,
    billing,
    deploy,
    deployments,
    jobs,
    keys,
    local,
    login,
    logs,
    models,
    run,
    status,
    usage,
)


class _PlatformGroup(TyperGroup):
    """The root command: every failure ends here and becomes a meaningful exit code."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = result if isinstance(result, int) else _common.EXIT_OK
        except PlatformError as e:
            code = _common.report(e)
        except typer.Abort:
            typer.echo("aborted", err=True)
            code = _common.EXIT_USER
        except (ValueError, TypeError) as e:
            # The SDK refuses a bad argument (an empty id, a naive time) before sending it:
            # the user's mistake, said in one line. Anything else is a bug: its traceback.
            if not _raised_by_sdk(e):
                raise
            typer.echo(f"error: {e}", err=True)
            code = _common.EXIT_USER
        except Exception as e:
            # click's own errors (typer >= 0.29 vendors click, so match them by shape): a
            # usage error (exit_code 2: bad flag or argument) is the user's, so it exits 1.
            show, exit_code = getattr(e, "show", None), getattr(e, "exit_code", None)
            if not (callable(show) and isinstance(exit_code, int)):
                raise
            show()
            code = _common.EXIT_USER if exit_code == 2 else exit_code
        if standalone_mode:
            raise SystemExit(code)
        return code


def _raised_by_sdk(error: BaseException) -> bool:
    """Whether `error` was raised in the SDK's own modules (sdk/, not its CLI)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    path = Path(tb.tb_frame.f_code.co_filename).resolve()
    return path.parent == _SDK_DIR


_SDK_DIR = Path(__file__).resolve().parents[1]


app = typer.Typer(
    name="platform",
    cls=_PlatformGroup,
    no_args_is_help=True,
    rich_markup_mode=None,
    # NOTE: pretty tracebacks print local variables: API keys and prompts. Never.
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def root(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="Platform URL [default: $PLATFORM_URL, `platform login`, http://127.0.0.1:8000].",
            show_default=False,
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="API key [default: $PLATFORM_API_KEY, `platform login`].",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serverless LLM inference: deploy models, run them, see what it cost.

    \b
    Examples:
        platform up --detach
        platform models create-demo ./demo && platform models upload ./demo models/demo/
        platform deploy --name demo --model store://models/demo/
        platform run demo --input prompt="Hello" --stream

    Exit codes: 0 ok, 1 your error (bad input, 4xx), 2 the platform's (5xx, unreachable).
    """
    # Tests pass a CliState (with a mock transport) as click's `obj`.
    state = ctx.obj if isinstance(ctx.obj, _common.CliState) else _common.CliState()
    state.url = url or state.url
    state.api_key = api_key or state.api_key
    ctx.obj = state
    _common.set_state(state)


app.command("up")(local.up)
app.command("down")(local.down)
app.command("login")(login.login)
app.command("deploy")(deploy.deploy)
app.command("run")(run.run)
app.command("status")(status.status)
app.command("usage")(usage.usage)
app.command("logs")(logs.logs)
app.add_typer(deployments.app, name="deployments")
app.add_typer(jobs.app, name="jobs")
app.add_typer(batch.app, name="batch")
app.add_typer(keys.app, name="keys")
app.add_typer(billing.app, name="billing")
app.add_typer(models.app, name="models")


def main() -> None:
    """Console script entry point (`platform = "sdk.cli.main:main"`)."""
    app(prog_name="platform")


if __name__ == "__main__":
    main()
