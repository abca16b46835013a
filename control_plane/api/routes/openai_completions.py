"""`POST /v1/completions`: one job per prompt (a list of prompts runs its jobs side by side),
each with `n` choices; choice `i * n + j` is prompt i's choice j, as OpenAI numbers them.

The jobs are admitted one after the other: when one is refused (a quota), those already
admitted are canceled and the call answers the refusal. Not streamed, the answer waits for
every job; streamed, their chunks are interleaved as they come, with one `[DONE]` (and one
usage chunk, summed) at the end. `X-Job-Id` names the first job, `X-Job-Ids` all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from control_plane.api import offload
from control_plane.api import openai_shapes as shapes
from control_plane.api.context import Ctx
from control_plane.api.openai_requests import CompletionRequest
from control_plane.api.routes.openai import _raise_for_job, _run, _sse, _stream, _wait
from control_plane.context import AppContext
from control_plane.services.jobs import callers

router = APIRouter(tags=["openai"])
_DONE = "data: [DONE]\n\n"


async def _admit(
    ctx: AppContext, authorization: str | None, body: CompletionRequest, prompts: list[str]
) -> tuple[list[dict[str, Any]], str]:
    """One job per prompt; none left behind when one is refused."""
    jobs: list[dict[str, Any]] = []
    tenant_id = ""
    try:
        for prompt in prompts:
            job_input = body.job_input(prompt, body.max_tokens, body.logprobs, special_tokens=True)
            job, tenant_id = await _run(ctx, authorization, body.model, job_input)
            jobs.append(job)
    except BaseException:
        for job in jobs:
            await offload.in_thread(callers.cancel_quietly, ctx, job["id"], tenant_id)
        raise
    return jobs, tenant_id


class _Choices:
    """Builds the choices of one call: their text, offsets and log-probabilities."""

    def __init__(self, body: CompletionRequest, prompts: list[str], envelope: dict[str, Any]):
        self.body, self.prompts, self.envelope = body, prompts, envelope
        self.n = body.n or 1
        self.top = body.logprobs
        # per choice: where its next chunk's text starts in the choice's text
        self.offsets = [len(self.echo(i // self.n)) for i in range(len(prompts) * self.n)]

    def echo(self, prompt_index: int) -> str:
        return self.prompts[prompt_index] if self.body.echo else ""

    def chunk(
        self,
        index: int,
        delta: str | None,
        finish: str | None,
        entries: list[dict[str, Any]] | None,
    ) -> dict[str, Any] | None:
        """A streamed chunk of choice `index` (the call's numbering)."""
        if delta is None:  # completions streams have no role chunk: the echo, if any
            delta, entries = self.echo(index // self.n), None
            if not delta:
                return None
        lp = None
        if self.top is not None:
            lp = shapes.completion_logprobs(entries or [], self.top, self.offsets[index])
            self.offsets[index] += sum(len(str(e.get("token", ""))) for e in entries or [])
        choice = {"index": index, "text": delta, "logprobs": lp, "finish_reason": finish}
        return {**self.envelope, "choices": [choice]}

    def whole(self, prompt_index: int, final: dict[str, Any]) -> list[dict[str, Any]]:
        """The choices of one prompt's finished job."""
        echoed = self.echo(prompt_index)
        return [
            {
                "index": prompt_index * self.n + c["index"],
                "text": echoed + c["text"],
                "logprobs": None
                if self.top is None
                else shapes.completion_logprobs(c["logprobs"], self.top, len(echoed)),
                "finish_reason": c["finish_reason"],
            }
            for c in shapes.choices(final)
        ]


async def _merged(streams: list[AsyncIterator[str]]) -> AsyncIterator[str]:
    """Interleave the jobs' SSE streams; one `[DONE]`; an error chunk ends them all."""
    queue: asyncio.Queue[str | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[str]) -> None:
        try:
            async for piece in stream:
                await queue.put(piece)
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    try:
        running = len(tasks)
        while running:
            piece = await queue.get()
            if piece is None:
                running -= 1
            elif piece != _DONE:
                yield piece
                if piece.startswith('data: {"error"'):
                    break
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


@router.post("/v1/completions")
async def completions(
    body: CompletionRequest,
    ctx: Ctx,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
) -> Any:
    prompts = body.checked().prompts()
    jobs, tenant_id = await _admit(ctx, authorization, body, prompts)
    cid, created = f"cmpl-{jobs[0]['id']}", int(time.time())
    headers = {"X-Job-Id": jobs[0]["id"], "X-Job-Ids": ",".join(j["id"] for j in jobs)}
    envelope = {"id": cid, "object": "text_completion", "created": created, "model": body.model}
    build = _Choices(body, prompts, envelope)
    n = build.n
    if body.stream:
        usage: list[dict[str, int]] = []

        def for_prompt(p: int) -> Any:
            return lambda i, delta, finish, entries: build.chunk(p * n + i, delta, finish, entries)

        streams = [
            _stream(ctx, job, tenant_id, for_prompt(p), None, n, usage_sink=usage)
            for p, job in enumerate(jobs)
        ]
        include = bool(body.stream_options and body.stream_options.include_usage)

        async def merged() -> AsyncIterator[str]:
            async for piece in _merged(streams):
                yield piece
            if include and len(usage) == len(jobs):
                yield _sse({**envelope, "choices": [], "usage": _sum(usage)})
            yield _DONE

        return StreamingResponse(merged(), media_type="text/event-stream", headers=headers)
    finals = await asyncio.gather(*(_wait(ctx, j["id"], tenant_id, request) for j in jobs))
    if any(final is None for final in finals):
        return Response(status_code=499, headers=headers)  # nobody reads it
    choices = []
    for p, final in enumerate(finals):
        assert final is not None
        _raise_for_job(final)
        choices += build.whole(p, final)
    usage_of = _sum([shapes.usage(final) for final in finals if final is not None])
    return JSONResponse(
        {**envelope, "choices": choices, "usage": usage_of},
        headers=headers,
    )


def _sum(usages: list[dict[str, int]]) -> dict[str, int]:
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    return {k: sum(u.get(k, 0) for u in usages) for k in keys}
