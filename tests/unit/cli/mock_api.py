"""The `platform` CLI driven through typer's CliRunner against httpx.MockTransport (no server):
`Routes` answers "METHOD /path" from a table and records what it was sent; `invoke` runs one
command line against it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from sdk.cli._common import CliState
from sdk.cli.main import app

DEPLOYMENT = {
    "id": "dep_1",
    "name": "demo",
    "model": "s3://models/demo/",
    "accelerator": "cpu",
    "min_workers": 0,
    "max_workers": 1,
    "scaledown_window_s": 60,
    "max_boot_s": 600,
    "execution_timeout_s": 600,
    "defaults": {"max_tokens": 64},
    "version": 3,
    "workers": {"idle": 1, "busy": 2},
}


class Routes:
    """A MockTransport handler: "METHOD /path" -> answers (the last one repeats)."""

    def __init__(self, routes: dict[str, httpx.Response | list[httpx.Response]]) -> None:
        self.routes = {k: v if isinstance(v, list) else [v] for k, v in routes.items()}
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        key = f"{request.method} {request.url.path}"
        answers = self.routes.get(key)
        if not answers:
            return httpx.Response(404, json={"title": "Not Found", "detail": f"no route {key}"})
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def called(self) -> list[str]:
        return [f"{r.method} {r.url.path}" for r in self.requests]

    def body(self, key: str) -> Any:
        [request] = [r for r in self.requests if f"{r.method} {r.url.path}" == key]
        return json.loads(request.content)


def invoke(args: list[str], routes: Routes | None = None, **client_options: Any) -> Any:
    options: dict[str, Any] = {"sleep": lambda _s: None, **client_options}
    if routes is not None:
        options["transport"] = httpx.MockTransport(routes)
    state = CliState(url="http://platform.test", client_options=options)
    return CliRunner().invoke(app, args, obj=state)


def not_found(detail: str = "deployment 'demo' does not exist") -> httpx.Response:
    return httpx.Response(404, json={"title": "Not Found", "status": 404, "detail": detail})


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    return path


def ok(body: Any, status: int = 200, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


def job(status: str, **fields: Any) -> dict[str, Any]:
    return {"id": "job_1", "deployment": "demo", "status": status, "attempt": 1, **fields}
