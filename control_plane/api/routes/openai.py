"""OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions.

`model` is the deployment name. Each call is a sync job of that deployment (its id is in the
`X-Job-Id` header), so billing, cancellation and limits are the platform's own. Errors use
OpenAI's shape (see `problems.openai_error`).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from common.protocol import TERMINAL_EVENTS, EventType
from control_plane.api import offload
from control_plane.api import openai_shapes as shapes
from control_plane.api.context import Ctx, Db, Principal, bearer_token
from control_plane.api.openai_requests import ChatCompletionRequest, CompletionRequest
from control_plane.api.schemas import JobInput
from control_plane.context import AppContext
from control_plane.domain.states import JobKind
from control_plane.errors import InvalidRequest, JobFailed, JobStillRunning
from control_plane.services import deployments
from control_plane.services.jobs import admission, callers
from control_plane.services.models.chat_template import DEFAULT_CHAT_TEMPLATE, render_chat

router = APIRouter(tags=["openai"])


def _render(ctx: AppContext, token: str, body: ChatCompletionRequest) -> tuple[str, bool]:
    """The chat rendered with the deployment's template (runs in a thread), and whether the
    worker adds the special tokens (only when the template is the platform's fallback: a
    model's template writes its own BOS, as transformers' `apply_chat_template` expects)."""
    view = ctx.edge.view()
    with ctx.sessions() as session:
        who = view.principal(session, token)
        dep = view.deployment(session, who.tenant_id, body.model)
    meta = ctx.model_meta.get(dep.id, dep.version, who.tenant_id, dep.spec.model)
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    # a template that fails, loops or grows without bound is a 400 (chat_template.TemplateError)
    if meta is None:
        return render_chat(DEFAULT_CHAT_TEMPLATE, messages, "", ""), True
    return meta.render_chat(messages), False


def _raise_for_job(job: dict[str, Any]) -> None:
    if job["status"] == "succeeded":
        return
    error = job.get("error") or {}
    if error.get("type") == "invalid_input":
        raise InvalidRequest(str(error.get("message", "invalid input")), job_id=job["id"])
    raise JobFailed(
        f"the job ended {job['status']}: {error.get('message', 'no detail')}", job_id=job["id"]
    )


async def _run(
    ctx: AppContext, authorization: str | None, model: str, job_input: JobInput
) -> tuple[dict[str, Any], str]:
    return await offload.in_thread(
        admission.create, ctx, bearer_token(authorization), model, job_input, JobKind.SYNC
    )


async def _wait(
    ctx: AppContext, job_id: str, tenant_id: str, request: Request
) -> dict[str, Any] | None:
    """The job as it ended (None: its caller went away, and the job was canceled)."""
    try:
        final = await callers.end_of(
            ctx, job_id, tenant_id, ctx.settings.sync_wait_max_s, request.is_disconnected
        )
    except callers.CallerGone:
        return None
    if final is None:  # it runs on: the caller may poll it
        raise JobStillRunning(
            f"the job did not finish within {ctx.settings.sync_wait_max_s:g} s; "
            f"poll GET /v1/jobs/{job_id}",
            job_id=job_id,
        )
    return final


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _stream_error(job_id: str, message: str, code: str) -> str:
    """The error chunk that ends an OpenAI stream; it names the job (`X-Job-Id` too)."""
    error = {"message": f"job {job_id}: {message}", "type": "server_error", "param": None,
             "code": code, "job_id": job_id}  # fmt: skip
    return _sse({"error": error})


# chunk(choice index, delta text | None for the opening chunk, finish reason, logprob entries)
# -> the data object (None: nothing to send)
Chunk = Callable[[int, str | None, str | None, list[dict[str, Any]] | None], dict[str, Any] | None]


async def _stream(
    ctx: AppContext,
    job: dict[str, Any],
    tenant_id: str,
    chunk: Chunk,
    include_usage: bool,
    n: int = 1,
) -> AsyncIterator[str]:
    """OpenAI streaming: `chunk` builds each data object.

    The deltas add up to the job's output (`callers.Follow`), and so do their log-probability
    entries (those a delta did not carry come with the last chunk). An OpenAI stream cannot
    take back text it sent: when the job was run again (its worker lost) and its new text
    departs from what was streamed, the stream ends with an error chunk naming the job
    instead, and the job runs on (its output: GET /v1/jobs/{id})."""
    for index in range(n):
        first = chunk(index, None, None, None)
        if first is not None:
            yield _sse(first)
    follow = callers.Follow(ctx, job["id"], tenant_id)
    logprobs_sent = [0] * n  # per choice
    async for event, data in follow.events():
        if event == EventType.OUTPUT:
            index, entries = int(data.get("index", 0)), data.get("logprobs")
            if not 0 <= index < n:
                continue
            logprobs_sent[index] += len(entries or ())
            yield _sse(chunk(index, data.get("delta", ""), None, entries) or {})
        elif event == EventType.RESTARTED:
            follow.let_run()
            message = (
                "its worker was lost and the job was run again; the new attempt's text does not "
                "continue the text streamed, which cannot be taken back. The job runs on: read "
                f"its output with GET /v1/jobs/{job['id']}"
            )
            yield _stream_error(job["id"], message, "job_restarted")
            break
        elif event == EventType.COMPLETED:
            for c in shapes.choices(data):
                if 0 <= c["index"] < n:
                    rest = c["logprobs"][logprobs_sent[c["index"]] :] or None
                    yield _sse(chunk(c["index"], "", c["finish_reason"], rest) or {})
            if include_usage:
                usage = {**(chunk(0, "", None, None) or {}), "choices": [],
                         "usage": shapes.usage(data)}  # fmt: skip
                yield _sse(usage)
            break
        elif event in TERMINAL_EVENTS:  # failed, canceled, expired, timed_out
            message = (data.get("error") or {}).get("message") or "no detail"
            yield _stream_error(job["id"], f"the job ended {data.get('status')}: {message}",
                                f"job_{data.get('status')}")  # fmt: skip
            break
    yield "data: [DONE]\n\n"


def _model_object(d: Any) -> dict[str, Any]:
    return {
        "id": d.name,
        "object": "model",
        "created": int(d.created_at.timestamp()),
        "owned_by": d.tenant_id,
    }


@router.get("/v1/models")
def list_models(session: Db, who: Principal) -> Any:
    who.require("read")
    return {
        "object": "list",
        "data": [_model_object(d) for d in deployments.list_(session, who.tenant_id)],
    }


@router.get("/v1/models/{model:path}")
def retrieve_model(model: str, session: Db, who: Principal) -> Any:
    """One deployment as an OpenAI model (the client's `models.retrieve`); another tenant's
    is not found, as a missing one."""
    who.require("read")
    return _model_object(deployments.get(session, who.tenant_id, model))


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest,
    ctx: Ctx,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
) -> Any:
    body.checked()
    prompt, special = await offload.in_thread(_render, ctx, bearer_token(authorization), body)
    top = body.logprobs_asked()
    max_tokens = body.max_completion_tokens or body.max_tokens
    job, tenant_id = await _run(
        ctx, authorization, body.model, body.job_input(prompt, max_tokens, top, special)
    )
    cid, created = f"chatcmpl-{job['id']}", int(time.time())
    headers = {"X-Job-Id": job["id"]}

    def logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        return None if top is None else shapes.chat_logprobs(entries or [], top)

    n = body.n or 1
    if body.stream:

        def chunk(
            index: int,
            delta: str | None,
            finish: str | None,
            entries: list[dict[str, Any]] | None,
        ) -> dict[str, Any]:
            d: dict[str, Any] = (
                {"role": "assistant", "content": ""}
                if delta is None
                else ({"content": delta} if delta else {})
            )
            choice = {"index": index, "delta": d, "logprobs": logprobs(entries),
                      "finish_reason": finish}  # fmt: skip
            return {"id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": body.model, "choices": [choice]}  # fmt: skip

        include = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _stream(ctx, job, tenant_id, chunk, include, n), media_type="text/event-stream",
            headers=headers,
        )  # fmt: skip
    final = await _wait(ctx, job["id"], tenant_id, request)
    if final is None:
        return Response(status_code=499, headers=headers)  # nobody reads it
    _raise_for_job(final)
    choices = [
        {
            "index": c["index"],
            "message": {"role": "assistant", "content": c["text"]},
            "finish_reason": c["finish_reason"],
            "logprobs": logprobs(c["logprobs"]),
        }
        for c in shapes.choices(final)
    ]
    return JSONResponse(
        {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": body.model,
            "choices": choices,
            "usage": shapes.usage(final),
        },
        headers=headers,
    )


@router.post("/v1/completions")
async def completions(
    body: CompletionRequest,
    ctx: Ctx,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
) -> Any:
    prompt = body.checked().single_prompt()
    top = body.logprobs
    job_input = body.job_input(prompt, body.max_tokens, top, special_tokens=True)
    job, tenant_id = await _run(ctx, authorization, body.model, job_input)
    cid, created = f"cmpl-{job['id']}", int(time.time())
    headers = {"X-Job-Id": job["id"]}
    echoed = prompt if body.echo else ""
    n = body.n or 1
    if body.stream:
        # per choice: where its next chunk's text starts in the choice's text
        text_offset = [len(echoed)] * n

        def chunk(
            index: int,
            delta: str | None,
            finish: str | None,
            entries: list[dict[str, Any]] | None,
        ) -> dict[str, Any] | None:
            if delta is None:  # completions streams have no role chunk: the echo, if any
                if not echoed:
                    return None
                delta = echoed
                entries = None
            lp = None
            if top is not None:
                lp = shapes.completion_logprobs(entries or [], top, text_offset[index])
                text_offset[index] += sum(len(str(e.get("token", ""))) for e in entries or [])
            return {"id": cid, "object": "text_completion", "created": created,
                    "model": body.model,
                    "choices": [{"index": index, "text": delta, "logprobs": lp,
                                 "finish_reason": finish}]}  # fmt: skip

        include = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _stream(ctx, job, tenant_id, chunk, include, n), media_type="text/event-stream",
            headers=headers,
        )  # fmt: skip
    final = await _wait(ctx, job["id"], tenant_id, request)
    if final is None:
        return Response(status_code=499, headers=headers)  # nobody reads it
    _raise_for_job(final)
    choices = [
        {
            "index": c["index"],
            "text": echoed + c["text"],
            "logprobs": None
            if top is None
            else shapes.completion_logprobs(c["logprobs"], top, len(echoed)),
            "finish_reason": c["finish_reason"],
        }
        for c in shapes.choices(final)
    ]
    return JSONResponse(
        {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": body.model,
            "choices": choices,
            "usage": shapes.usage(final),
        },
        headers=headers,
    )
