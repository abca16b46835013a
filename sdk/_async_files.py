# Source of sdk/_files.py: edit this file, then run `python infra/unasync.py`.
"""`client.files`: the tenant's own namespace in the platform's store (`store://path`).

Deploy a model from it, or read a batch's input from it; no other tenant can name it.

uploaded = await client.files.upload_dir("./demo-model", "models/demo/")
await client.deployments.create(name="demo", model=uploaded)  # "store://models/demo/"

A local file is sent as it is read, a piece at a time, never whole in memory: a 16 GB
checkpoint uploads with the memory of a small one.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeVar, cast

import httpx

from sdk import _flows as flows
from sdk import _routes as routes
from sdk._async_resource import AsyncResource
from sdk._models import StoredFile

T = TypeVar("T")

# A local file is read and sent this many bytes at a time: big enough that the cost of each
# piece vanishes, small enough that memory stays flat whatever the file's size.
CHUNK_BYTES = 1024 * 1024


class AsyncFiles(AsyncResource):
    """`client.files`: upload, list and delete files of `store://`."""

    async def upload(self, path: str, data: bytes | str | Path) -> StoredFile:
        """Store `data` (bytes, or a local file's path) at `store://<path>`.

        A file is streamed from disk with its length declared (`Content-Length`), and read
        again from its start if the request has to be retried.
        """
        if isinstance(data, bytes):
            return StoredFile(await self._object(routes.upload_file(path, data)))
        body = _AsyncFileBody(Path(data))
        flow = flows.request_object(self._client._rt, routes.upload_file(path, b""))
        return StoredFile(await self._run(_sending(body, flow)))

    async def upload_dir(self, directory: str | Path, prefix: str) -> str:
        """Upload every file under `directory` to `store://<prefix>/...`; returns that URI."""
        root = Path(directory)
        files = sorted(p for p in root.rglob("*") if p.is_file())
        if not files:
            raise ValueError(f"{root} holds no files")
        prefix = prefix.removeprefix("store://").strip("/") + "/"
        for file in files:
            await self.upload(prefix + file.relative_to(root).as_posix(), file)
        return "store://" + prefix

    async def list(self, prefix: str = "") -> builtins.list[StoredFile]:
        """Files under `prefix` (every page), in path order."""
        return [StoredFile(raw) for raw in await self._list(routes.list_files(prefix), None)]

    async def delete(self, path: str) -> None:
        """Remove one file; NotFoundError when there is none at `path`."""
        await self._json(routes.delete_file(path))


class _AsyncFileBody:
    """A local file as a request body: its first `size_bytes` (its size when this is made),
    read CHUNK_BYTES at a time from the start each time the body is iterated (so a retried
    request sends the whole file again).

    NOTE: each piece is a plain (blocking) read, in the asyncio client too: one piece from a
    local disk takes a small fraction of the time sending it takes.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size_bytes = path.stat().st_size  # a missing file fails here, before any request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        left = self.size_bytes
        with self.path.open("rb") as f:
            # A file that shrank meanwhile ends early: the server then never sees a whole body.
            while left > 0 and (chunk := f.read(min(CHUNK_BYTES, left))):
                left -= len(chunk)
                yield chunk


def _sending(body: _AsyncFileBody, flow: flows.Flow[T]) -> flows.Flow[T]:
    """`flow` (of a call with an empty body), each request it sends carrying `body` instead.

    NOTE: httpx sends an iterated body chunked; this one keeps the file's length in
    `Content-Length`, so the API knows the size before the first byte (and sizes its parts).
    """
    outcome: flows.Outcome = None
    while True:
        try:
            action = flow.send(outcome)
        except StopIteration as stop:
            return cast(T, stop.value)
        if isinstance(action, flows.Send):
            request = action.request
            headers = httpx.Headers(request.headers)
            headers["Content-Length"] = str(body.size_bytes)
            request = httpx.Request(
                request.method,
                request.url,
                headers=headers,
                content=body,
                extensions=request.extensions,
            )
            action = flows.Send(request, action.stream)
        outcome = yield action
