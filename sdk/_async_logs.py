# Source of sdk/_logs.py: edit this file, then run `python tests/tools/unasync.py`.
"""`client.logs`: the platform's log lines of a job, a worker or a deployment.

    await client.logs("job_01HX…")                       # [line, …], oldest first
    await client.logs("demo", since="15m", limit=200)     # a deployment, by name
    async with await client.logs.follow("wrk_01HX…") as lines:
        async for line in lines: ...                      # new lines as they are written

Each line is a dict: `timestamp`, `level`, `component`, `message` and the ids and facts it
carries (`job_id`, `worker_id`, `deployment_id`, `attempt`, `status`, `reason`, ...); a text
line of a worker's output (a crash before logging started) has `raw: true`. Never a prompt or
an output: the platform does not log them.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from sdk import _flows as flows
from sdk import _routes as routes
from sdk._async_resource import AsyncResource, AsyncResponseIterator
from sdk._base import parse_jsonl_line
from sdk._errors import APIConnectionError
from sdk._routes import Time


class AsyncLogLines(AsyncResponseIterator[dict[str, Any]]):
    """Log lines as they are written (the last `limit` first), until closed: read it inside
    `async with` so the connection is released.

    Example:
        async with await client.logs.follow("job_01HX…") as lines:
            async for line in lines:
                print(line["timestamp"], line["message"])
    """

    def __init__(self, response: httpx.Response, target: str) -> None:
        self._response = response
        self.target = target
        self._items = self._generate()

    async def _generate(self) -> AsyncGenerator[dict[str, Any], None]:
        what = f"logs of {self.target}"
        try:
            async for line in self._response.aiter_lines():
                item = parse_jsonl_line(line, what)  # a blank line: the platform's keep-alive
                if item is not None:
                    yield item
        except httpx.TransportError as e:
            raise APIConnectionError(f"the {what} broke off: {e}") from e
        finally:
            await self._response.aclose()


class AsyncLogs(AsyncResource):
    """`client.logs(target)`: a job's (`job_…`), a worker's (`wrk_…`) or a deployment's (its
    name) log lines; `client.logs.follow(target)`: the same, then new ones as they come.
    Another tenant's job, worker or deployment raises NotFoundError, as a missing one does."""

    async def __call__(
        self, target: str, *, since: Time | float = None, limit: int | None = None
    ) -> builtins.list[dict[str, Any]]:
        """The last `limit` lines (the platform's default: 1,000), oldest first, from `since`
        (a datetime, an ISO 8601 string, or an age: "15m", "2h", or a number of seconds)."""
        body = await self._json(routes.logs(target, since, limit, follow=False))
        data = body.get("data") if isinstance(body, dict) else None
        return [line for line in data or [] if isinstance(line, dict)]

    async def follow(
        self, target: str, *, since: Time | float = None, limit: int | None = None
    ) -> AsyncLogLines:
        """The last `limit` lines, then new ones as they are written, until closed."""
        call = routes.logs(target, since, limit, follow=True)
        response = await self._run(flows.send(self._client._rt, call))
        return AsyncLogLines(response, target)
