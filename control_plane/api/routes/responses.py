"""OpenAI's Responses API, stateless: `POST /v1/responses` (`client.responses.create` and
`client.responses.stream`, and the agent frameworks built on them).

The call is the chat its `instructions` and `input` stand for, rendered and run as
`/v1/chat/completions` runs one (`routes/openai.py`): one sync job of the deployment named by
`model` (its id in `X-Job-Id`), waited for or streamed. Nothing is stored: the response's id
names its job, which `GET /v1/jobs/{id}` reads.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from common.protocol import TERMINAL_EVENTS, EventType
from control_plane.api import offload
from control_plane.api import responses_shapes as shapes
from control_plane.api.context import Ctx, bearer_token
from control_plane.api.openai_tools import forced_call
from control_plane.api.responses_api import ResponsesRequest
from control_plane.api.routes.openai import _raise_for_job, _render_chat, _run, _wait
from control_plane.api.tool_calls import StreamParser
from control_plane.context import AppContext
from control_plane.errors import ContextTooLong, TemplateError
from control_plane.services.jobs import callers

router = APIRouter(tags=["openai"])


@router.post("/v1/responses")
async def create_response(
    body: ResponsesRequest,
    ctx: Ctx,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
) -> Any:
    structured = body.checked().structured()
    chat = body.chat_request()
    try:
        rendered = await offload.in_thread(_render_chat, ctx, bearer_token(authorization), chat)
        mode = chat.tool_mode()
        forced = forced_call(chat.tools, mode, rendered.tool_parser, chat.parallel_tool_calls)
        job_input = body.job_input(
            chat, rendered.prompt, rendered.special_tokens, structured, forced
        )
        job, tenant_id = await _run(ctx, authorization, body.model, job_input)
    except (ContextTooLong, TemplateError) as exc:
        # a template that fails on this chat, or a prompt too long for the context: the
        # input is at fault, which chat calls `messages`
        exc.extra.setdefault("param", "input")
        raise
    top = body.logprobs_asked()
    parser = None if mode == "none" else rendered.tool_parser  # function calls are parsed
    start = shapes.opened(job["id"], int(time.time()), body.echoed())
    headers = {"X-Job-Id": job["id"]}
    if body.stream:
        events = _stream(ctx, job["id"], tenant_id, start, top, parser)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    final = await _wait(ctx, job["id"], tenant_id, request)
    if final is None:
        return Response(status_code=499, headers=headers)  # nobody reads it
    _raise_for_job(final)
    return JSONResponse(
        shapes.finished(start, job["id"], final, top, int(time.time()), parser), headers=headers
    )


async def _stream(
    ctx: AppContext,
    job_id: str,
    tenant_id: str,
    start: dict[str, Any],
    top: int | None,
    parser: str | None,
) -> AsyncIterator[str]:
    """The job's events as OpenAI's response events.

    The deltas add up to the job's output (`callers.Follow`). A stream cannot take back text
    it sent: when the job was run again (its worker lost) and its new text departs from what
    was streamed, the stream ends failed (`job_restarted`) and the job runs on (its output:
    GET /v1/jobs/{id}), as on the chat route."""
    out = shapes.EventStream(job_id)
    for line in out.opening(start):
        yield line
    # with tools: text that may be a function call is held back (tool_calls.StreamParser)
    calls = StreamParser(parser) if parser is not None else None
    follow = callers.Follow(ctx, job_id, tenant_id)
    async for event, data in follow.events():
        if event == EventType.OUTPUT:
            if int(data.get("index", 0)) == 0:  # one choice: the only index
                text = str(data.get("delta", ""))
                text = text if calls is None else calls.feed(text)
                if text or calls is None:
                    yield out.delta(text, data.get("logprobs"), top)
        elif event == EventType.RESTARTED:
            follow.let_run()
            message = (
                "its worker was lost and the job was run again; the new attempt's text does not "
                "continue the text streamed, which cannot be taken back. The job runs on: read "
                f"its output with GET /v1/jobs/{job_id}"
            )
            for line in out.failing(start, message, "job_restarted"):
                yield line
            return
        elif event == EventType.COMPLETED:
            end = shapes.finished(start, job_id, data, top, int(time.time()), parser, True)
            if calls is not None and (rest := calls.finish()[0]):
                yield out.delta(rest, None, top)  # held back, and not a call after all
            for line in out.closing(end):
                yield line
            return
        elif event in TERMINAL_EVENTS:  # failed, canceled, expired, timed_out
            status = data.get("status")
            detail = (data.get("error") or {}).get("message") or "no detail"
            for line in out.failing(start, f"the job ended {status}: {detail}", f"job_{status}"):
                yield line
            return
