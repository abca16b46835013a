"""/v1/files (a tenant's namespace in the platform's store) and /v1/storage-credentials (keys
a tenant registers for its own buckets). See docs/security.md."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import unquote_to_bytes

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from control_plane.api.context import Ctx, Db, Now, Principal
from control_plane.api.schemas import Line
from control_plane.errors import InvalidRequest
from control_plane.services.storage import files, storage_access

router = APIRouter(tags=["files"])


class CredentialCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bucket: Line = Field(min_length=3, max_length=63)
    access_key_id: Line = Field(min_length=1, max_length=200)
    secret_access_key: Line = Field(min_length=1, max_length=500)
    endpoint_url: Line | None = Field(None, max_length=500)
    region: Line | None = Field(None, max_length=40)


# The server hands the body over in pieces of up to 256 KB; this many bytes of them go to a
# thread (`Upload.add`) at a time, so the trips cost little per byte (the pieces are not joined
# here: copying a file's bytes once more would cost more than the trips it saves).
HANDOFF_BYTES = 1024 * 1024


def _utf8_path(request: Request) -> None:
    """Refuse a path whose percent-escapes are not UTF-8. The server decodes them leniently
    (`a%ff` becomes `a\ufffd`), so the file would be stored under a name the client never
    wrote, and a second such path would land on the same one."""
    raw = request.scope.get("raw_path") or b""
    try:
        unquote_to_bytes(raw).decode()
    except UnicodeDecodeError:
        raise InvalidRequest(
            "the file path is not UTF-8 once percent-decoded: escapes such as %ff must spell "
            "UTF-8 bytes",
            errors=[{"field": "path", "message": "percent-escapes must spell UTF-8"}],
        ) from None


@router.put("/v1/files/{path:path}", status_code=201)
async def upload_file(path: str, request: Request, ctx: Ctx, who: Principal) -> Any:
    """Store the request body as `store://<path>` (replacing any file there)."""
    who.require("deploy")
    _utf8_path(request)
    declared = request.headers.get("content-length", "")
    upload = files.Upload(
        ctx.settings,
        who.tenant_id,
        files.file_location(path),
        declared_bytes=int(declared) if declared.isdigit() else None,
    )
    try:
        gathered: list[bytes] = []
        gathered_bytes = 0
        async for chunk in request.stream():
            gathered.append(chunk)
            gathered_bytes += len(chunk)
            if gathered_bytes >= HANDOFF_BYTES:
                await run_in_threadpool(upload.add, *gathered)
                gathered, gathered_bytes = [], 0
        if gathered_bytes:
            await run_in_threadpool(upload.add, *gathered)
        return await run_in_threadpool(upload.finish)
    except BaseException:
        await run_in_threadpool(upload.abort)
        raise


@router.get("/v1/files")
def list_files(
    ctx: Ctx,
    who: Principal,
    prefix: Annotated[str, Query(max_length=2_000)] = "",
    cursor: Annotated[str | None, Query(max_length=2_000)] = None,
    limit: Annotated[int, Query(ge=1, le=files.MAX_LIST)] = 100,
) -> Any:
    who.require("read")
    data, next_cursor = files.list_(ctx.settings, who.tenant_id, prefix, cursor, limit)
    return {"data": data, "next_cursor": next_cursor}


@router.delete("/v1/files/{path:path}", status_code=204)
def delete_file(path: str, request: Request, ctx: Ctx, who: Principal) -> Response:
    who.require("deploy")
    _utf8_path(request)
    files.delete(ctx.settings, who.tenant_id, path)
    return Response(status_code=204)


@router.post("/v1/storage-credentials", status_code=201)
def register_credential(
    body: CredentialCreate, ctx: Ctx, session: Db, who: Principal, at: Now
) -> Any:
    who.require("admin")
    row = storage_access.register(session, ctx.settings, who.tenant_id, body.model_dump(), at)
    session.commit()
    return storage_access.credential_public(row)


@router.get("/v1/storage-credentials")
def list_credentials(session: Db, who: Principal) -> Any:
    who.require("read")
    return {
        "data": [
            storage_access.credential_public(r)
            for r in storage_access.list_credentials(session, who.tenant_id)
        ]
    }


@router.delete("/v1/storage-credentials/{cred_id}", status_code=204)
def delete_credential(cred_id: str, session: Db, who: Principal) -> Response:
    who.require("admin")
    storage_access.delete_credential(session, who.tenant_id, cred_id)
    session.commit()
    return Response(status_code=204)
