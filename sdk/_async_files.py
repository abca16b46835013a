# Source of sdk/_files.py: edit this file, then run `python tests/tools/unasync.py`.
"""`client.files`: the tenant's own namespace in the platform's store (`store://path`).

Deploy a model from it, or read a batch's input from it; no other tenant can name it.

uploaded = await client.files.upload_dir("./demo-model", "models/demo/")
await client.deployments.create(name="demo", model=uploaded)  # "store://models/demo/"

A local file is sent as it is read, a piece at a time, never whole in memory: a 16 GB
checkpoint uploads with the memory of a small one.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from pathlib import Path

from sdk import _routes as routes
from sdk._async_resource import AsyncResource
from sdk._base import FileBody
from sdk._models import StoredFile


class AsyncFiles(AsyncResource):
    """`client.files`: upload, list and delete files of `store://`."""

    async def upload(
        self,
        path: str,
        data: bytes | str | Path,
        progress: Callable[[int], None] | None = None,
    ) -> StoredFile:
        """Store `data` (bytes, or a local file's path) at `store://<path>`.

        A file is streamed from disk with its length declared (`Content-Length`), and read
        again from its start if the request has to be retried. `progress` hears the bytes of
        the file sent so far (from 0 again on a retry).
        """
        body = data if isinstance(data, bytes) else FileBody(data, progress)
        return StoredFile(await self._object(routes.upload_file(path, body)))

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
