"""OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions.

`model` is the deployment name. Each call is a sync job of that deployment (its id is in the
`X-Job-Id` header), so billing, cancellation and limits are the platform's own. Errors use
OpenAI's shape (see `problems.openai_error`).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from common.protocol import TERMINAL_EVENTS, EventType
from control_plane.api import offload
from control_plane.api.context import Ctx, Db, Principal, bearer_token
from control_plane.api.schemas import JobInput, Line, Text, unicode_text
from control_plane.context import AppContext
from control_plane.domain.states import JobKind
from control_plane.errors import InvalidRequest, JobFailed, JobStillRunning
from control_plane.services import deployments
from control_plane.services.jobs import admission, callers
from control_plane.services.models.model_meta import DEFAULT_CHAT_TEMPLATE, render_chat

router = APIRouter(tags=["openai"])


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    # Unknown OpenAI parameters are accepted and ignored, as OpenAI-compatible servers do;
    # the ones this platform cannot honour are refused explicitly below.
    model_config = ConfigDict(extra="allow")

    model: Line = Field(min_length=1, description="deployment name")
    max_tokens: int | None = Field(None, ge=1, le=32_768)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: Text | list[Text] | None = None
    seed: int | None = Field(None, ge=0)
    n: int = Field(1, ge=1, le=1, description="only 1 is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None

    @model_validator(mode="after")
    def _unsupported(self) -> _Common:
        extra = self.model_extra or {}
        for name in ("logprobs", "top_logprobs", "tools", "functions", "logit_bias", "suffix"):
            if extra.get(name) not in (None, False, [], {}):
                raise ValueError(f"'{name}' is not supported by this platform")
        if extra.get("echo"):
            raise ValueError("'echo' is not supported by this platform")
        return self

    def job_input(self, prompt: str, max_tokens: int | None) -> JobInput:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        return JobInput(
            prompt=prompt,
            max_tokens=max_tokens,
            # OpenAI's default temperature is 1.
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=stop,
        )


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _text_parts_only(
        cls, v: str | list[dict[str, Any]] | None
    ) -> str | list[dict[str, Any]] | None:
        # Checked at the edge: an image or audio part is the caller's input, a 400, never a 500.
        for part in v if isinstance(v, list) else []:
            if part.get("type") != "text" or not isinstance(part.get("text", ""), str):
                raise ValueError(
                    f"message content of type {part.get('type')!r} is not supported "
                    "(text parts only)"
                )
            unicode_text(part.get("text", ""))  # a part's text is Text too
        return v

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(str(part.get("text", "")) for part in self.content)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=32_768)


class CompletionRequest(_Common):
    prompt: Text | list[Text]
    max_tokens: int | None = Field(16, ge=1, le=32_768)

    def single_prompt(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) != 1:
            raise InvalidRequest("only one prompt per request is supported", param="prompt")
        return self.prompt[0]


def _render(ctx: AppContext, token: str, body: ChatCompletionRequest) -> str:
    """The chat rendered with the deployment's template (runs in a thread)."""
    view = ctx.edge.view()
    with ctx.sessions() as session:
        who = view.principal(session, token)
        dep = view.deployment(session, who.tenant_id, body.model)
    meta = ctx.model_meta.get(dep.id, dep.version, who.tenant_id, dep.spec.model)
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        if meta is None:
            return render_chat(DEFAULT_CHAT_TEMPLATE, messages, "", "")
        return meta.render_chat(messages)
    except Exception as exc:
        raise InvalidRequest(f"the chat template could not render these messages: {exc}") from exc


def _finish_reason(job: dict[str, Any]) -> str:
    out = job.get("output") or {}
    return "length" if out.get("finish_reason") == "length" else "stop"


def _usage(job: dict[str, Any]) -> dict[str, int]:
    u = job.get("usage") or {}
    prompt, completion = int(u.get("prompt_tokens") or 0), int(u.get("generated_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


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


async def _stream(
    ctx: AppContext,
    job: dict[str, Any],
    tenant_id: str,
    chunk: Any,
    include_usage: bool,
) -> AsyncIterator[str]:
    """OpenAI streaming: `chunk(delta_text | None, finish_reason)` builds each data object.

    The deltas add up to the job's output (`callers.Follow`). An OpenAI stream cannot take
    back text it sent: when the job was run again (its worker lost) and its new text departs
    from what was streamed, the stream ends with an error chunk naming the job instead, and the
    job runs on (its output: GET /v1/jobs/{id})."""
    first = chunk(None, None)
    if first is not None:
        yield _sse(first)
    follow = callers.Follow(ctx, job["id"], tenant_id)
    async for event, data in follow.events():
        if event == EventType.OUTPUT:
            yield _sse(chunk(data.get("delta", ""), None))
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
            yield _sse(chunk("", _finish_reason(data)))
            if include_usage:
                usage = {**chunk("", None), "choices": [], "usage": _usage(data)}
                yield _sse(usage)
            break
        elif event in TERMINAL_EVENTS:  # failed, canceled, expired, timed_out
            message = (data.get("error") or {}).get("message") or "no detail"
            yield _stream_error(job["id"], f"the job ended {data.get('status')}: {message}",
                                f"job_{data.get('status')}")  # fmt: skip
            break
    yield "data: [DONE]\n\n"


@router.get("/v1/models")
def list_models(session: Db, who: Principal) -> Any:
    who.require("read")
    return {
        "object": "list",
        "data": [
            {
                "id": d.name,
                "object": "model",
                "created": int(d.created_at.timestamp()),
                "owned_by": d.tenant_id,
            }
            for d in deployments.list_(session, who.tenant_id)
        ],
    }


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest,
    ctx: Ctx,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
) -> Any:
    prompt = await offload.in_thread(_render, ctx, bearer_token(authorization), body)
    job_input = body.job_input(prompt, body.max_completion_tokens or body.max_tokens)
    job, tenant_id = await _run(ctx, authorization, body.model, job_input)
    cid, created = f"chatcmpl-{job['id']}", int(time.time())
    headers = {"X-Job-Id": job["id"]}
    if body.stream:

        def chunk(delta: str | None, finish: str | None) -> dict[str, Any]:
            d: dict[str, Any] = (
                {"role": "assistant", "content": ""}
                if delta is None
                else ({"content": delta} if delta else {})
            )
            return {"id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": body.model,
                    "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}  # fmt: skip

        include = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _stream(ctx, job, tenant_id, chunk, include), media_type="text/event-stream",
            headers=headers,
        )  # fmt: skip
    final = await _wait(ctx, job["id"], tenant_id, request)
    if final is None:
        return Response(status_code=499, headers=headers)  # nobody reads it
    _raise_for_job(final)
    text = (final.get("output") or {}).get("text", "")
    return JSONResponse(
        {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": body.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": _finish_reason(final),
                    "logprobs": None,
                }
            ],
            "usage": _usage(final),
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
    job, tenant_id = await _run(
        ctx, authorization, body.model, body.job_input(body.single_prompt(), body.max_tokens)
    )
    cid, created = f"cmpl-{job['id']}", int(time.time())
    headers = {"X-Job-Id": job["id"]}
    if body.stream:

        def chunk(delta: str | None, finish: str | None) -> dict[str, Any] | None:
            if delta is None:
                return None  # completions streams have no role chunk
            return {"id": cid, "object": "text_completion", "created": created,
                    "model": body.model,
                    "choices": [{"index": 0, "text": delta, "logprobs": None,
                                 "finish_reason": finish}]}  # fmt: skip

        include = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _stream(ctx, job, tenant_id, chunk, include), media_type="text/event-stream",
            headers=headers,
        )  # fmt: skip
    final = await _wait(ctx, job["id"], tenant_id, request)
    if final is None:
        return Response(status_code=499, headers=headers)  # nobody reads it
    _raise_for_job(final)
    return JSONResponse(
        {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": body.model,
            "choices": [
                {
                    "index": 0,
                    "text": (final.get("output") or {}).get("text", ""),
                    "logprobs": None,
                    "finish_reason": _finish_reason(final),
                }
            ],
            "usage": _usage(final),
        },
        headers=headers,
    )
