"""OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions.

`model` is the deployment name. Each call is a sync job of that deployment (its id is in the
`X-Job-Id` header), so billing, cancellation and limits are the platform's own. Errors use
OpenAI's shape (see `problems.openai_error`).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from common.protocol import TERMINAL_EVENTS, EventType
from control_plane.api import offload
from control_plane.api import openai_shapes as shapes
from control_plane.api.context import Ctx, Db, Principal, bearer_token
from control_plane.api.openai_chat import ChatAnswer
from control_plane.api.openai_requests import ChatCompletionRequest
from control_plane.api.openai_tools import forced_call
from control_plane.api.schemas import JobInput
from control_plane.api.tool_calls import parser_for
from control_plane.context import AppContext
from control_plane.domain.states import JobKind
from control_plane.errors import InvalidRequest, JobFailed, JobStillRunning
from control_plane.services import deployments
from control_plane.services.jobs import admission, callers
from control_plane.services.models.chat_template import DEFAULT_CHAT_TEMPLATE, render_chat

router = APIRouter(tags=["openai"])


@dataclass(frozen=True, slots=True)
class Rendered:
    prompt: str
    # whether the worker adds the special tokens (only for the platform's fallback template:
    # a model's template writes its own BOS, as transformers' `apply_chat_template` expects)
    special_tokens: bool
    # the deployment's tool-call format (api/tool_calls.py)
    tool_parser: str


def _render_chat(ctx: AppContext, token: str, body: ChatCompletionRequest) -> Rendered:
    """The chat rendered with the deployment's template, its tools offered to it (runs in a
    thread). A template that fails, loops or grows without bound is a 400
    (`chat_template.TemplateError`)."""
    view = ctx.edge.view()
    with ctx.sessions() as session:
        who = view.principal(session, token)
        dep = view.deployment(session, who.tenant_id, body.model)
    meta = ctx.model_meta.get(dep.id, dep.version, who.tenant_id, dep.spec.model)
    messages = [m.for_template() for m in body.messages]
    tools = [t.for_template() for t in body.tools] if body.tools else None
    template = DEFAULT_CHAT_TEMPLATE if meta is None else meta.chat_template
    parser = parser_for(dep.spec.tool_parser, template)
    if meta is None:
        return Rendered(render_chat(template, messages, "", "", tools=tools), True, parser)
    return Rendered(meta.render_chat(messages, tools), False, parser)


def _render(ctx: AppContext, token: str, body: ChatCompletionRequest) -> tuple[str, bool]:
    """The chat rendered, and whether the worker adds the special tokens."""
    rendered = _render_chat(ctx, token, body)
    return rendered.prompt, rendered.special_tokens


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
# -> the data objects to send (a list, one, or None for none)
Chunk = Callable[
    [int, str | None, str | None, list[dict[str, Any]] | None],
    dict[str, Any] | list[dict[str, Any]] | None,
]


def _sse_all(objs: dict[str, Any] | list[dict[str, Any]] | None) -> str:
    return "".join(_sse(o) for o in ([objs] if isinstance(objs, dict) else objs or []))


async def _stream(
    ctx: AppContext,
    job: dict[str, Any],
    tenant_id: str,
    chunk: Chunk,
    usage_envelope: dict[str, Any] | None,
    n: int = 1,
    usage_sink: list[dict[str, int]] | None = None,
) -> AsyncIterator[str]:
    """OpenAI streaming: `chunk` builds the data objects; with `usage_envelope` (the
    chunks' id, object, created, model) a last chunk carries the usage; with `usage_sink`
    the usage is added to it instead (a caller merging several jobs' streams sums them).

    The deltas add up to the job's output (`callers.Follow`), and so do their log-probability
    entries (those a delta did not carry come with the last chunk). An OpenAI stream cannot
    take back text it sent: when the job was run again (its worker lost) and its new text
    departs from what was streamed, the stream ends with an error chunk naming the job
    instead, and the job runs on (its output: GET /v1/jobs/{id})."""
    for index in range(n):
        if first := _sse_all(chunk(index, None, None, None)):
            yield first
    follow = callers.Follow(ctx, job["id"], tenant_id)
    logprobs_sent = [0] * n  # per choice
    async for event, data in follow.events():
        if event == EventType.OUTPUT:
            index, entries = int(data.get("index", 0)), data.get("logprobs")
            if not 0 <= index < n:
                continue
            logprobs_sent[index] += len(entries or ())
            if out := _sse_all(chunk(index, data.get("delta", ""), None, entries)):
                yield out
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
                    yield _sse_all(chunk(c["index"], "", c["finish_reason"], rest))
            if usage_sink is not None:
                usage_sink.append(shapes.usage(data))
            elif usage_envelope is not None:
                yield _sse({**usage_envelope, "choices": [], "usage": shapes.usage(data)})
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
    rendered = await offload.in_thread(_render_chat, ctx, bearer_token(authorization), body)
    mode = body.tool_mode()
    forced = forced_call(body.tools, mode, rendered.tool_parser, body.parallel_tool_calls)
    top = body.logprobs_asked()
    max_tokens = body.max_completion_tokens or body.max_tokens
    job_input = body.job_input(rendered.prompt, max_tokens, top, rendered.special_tokens, forced)
    job, tenant_id = await _run(ctx, authorization, body.model, job_input)
    cid, created = f"chatcmpl-{job['id']}", int(time.time())
    headers = {"X-Job-Id": job["id"]}
    parser = None if mode == "none" else rendered.tool_parser
    answer = ChatAnswer(cid, body.model, created, top=top, parser=parser)
    n = body.n or 1
    if body.stream:

        def chunk(
            index: int,
            delta: str | None,
            finish: str | None,
            entries: list[dict[str, Any]] | None,
        ) -> list[dict[str, Any]]:
            return answer.chunks(index, delta, finish, entries, job["id"])

        envelope = None
        if body.stream_options and body.stream_options.include_usage:
            envelope = {"id": cid, "object": "chat.completion.chunk", "created": created,
                        "model": body.model}  # fmt: skip
        return StreamingResponse(
            _stream(ctx, job, tenant_id, chunk, envelope, n), media_type="text/event-stream",
            headers=headers,
        )  # fmt: skip
    final = await _wait(ctx, job["id"], tenant_id, request)
    if final is None:
        return Response(status_code=499, headers=headers)  # nobody reads it
    _raise_for_job(final)
    return JSONResponse(
        {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": body.model,
            "choices": [answer.message_choice(c, job["id"]) for c in shapes.choices(final)],
            "usage": shapes.usage(final),
        },
        headers=headers,
    )
