"""A chat completion's answer from its job: choices with their messages (tool calls parsed from
the text when the request offered tools), and the chunks of a streamed one.

Example:

    >>> answer = ChatAnswer("chatcmpl-1", "demo", 0, top=None, parser=None)
    >>> answer.message_choice({"index": 0, "text": "Hi", "finish_reason": "stop",
    ...                        "logprobs": []}, "job_1")["message"]
    {'role': 'assistant', 'content': 'Hi'}
"""

from __future__ import annotations

from typing import Any

from control_plane.api import openai_shapes as shapes
from control_plane.api.openai_tools import answer_calls
from control_plane.api.tool_calls import StreamParser, parse


class ChatAnswer:
    """Builds one call's answer. `top`: alternatives per token when log-probabilities were
    asked (None: not); `parser`: the deployment's tool-call format when the request offered
    tools and let the model use them (None: the text is all content)."""

    def __init__(
        self, cid: str, model: str, created: int, *, top: int | None, parser: str | None
    ) -> None:
        self.cid, self.model, self.created = cid, model, created
        self.top, self.parser = top, parser
        self._streams: dict[int, StreamParser] = {}

    def logprobs(self, entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        return None if self.top is None else shapes.chat_logprobs(entries or [], self.top)

    def message_choice(self, choice: dict[str, Any], job_id: str) -> dict[str, Any]:
        """One choice of a complete answer (`openai_shapes.choices`' item)."""
        message: dict[str, Any] = {"role": "assistant", "content": choice["text"]}
        finish = choice["finish_reason"]
        if self.parser is not None:
            content, calls = parse(self.parser, choice["text"])
            if calls:
                message = {"role": "assistant", "content": content,
                           "tool_calls": answer_calls(calls, job_id, choice["index"])}  # fmt: skip
                finish = "tool_calls"
        return {
            "index": choice["index"],
            "message": message,
            "finish_reason": finish,
            "logprobs": self.logprobs(choice["logprobs"]),
        }

    def _chunk(
        self, index: int, delta: dict[str, Any], finish: str | None, lp: dict[str, Any] | None
    ) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        return {"id": self.cid, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [choice]}  # fmt: skip

    def chunks(
        self,
        index: int,
        delta: str | None,
        finish: str | None,
        entries: list[dict[str, Any]] | None,
        job_id: str,
    ) -> list[dict[str, Any]]:
        """The chunks for one step of the stream (`routes/openai._stream`'s `chunk`): the
        opening one (delta None), a text delta, or the end (finish set)."""
        if delta is None:
            return [self._chunk(index, {"role": "assistant", "content": ""}, None, None)]
        lp = self.logprobs(entries)
        if self.parser is None:
            return [self._chunk(index, {"content": delta} if delta else {}, finish, lp)]
        stream = self._streams.setdefault(index, StreamParser(self.parser))
        out = []
        content = stream.feed(delta)
        if finish is None:
            if content or lp is not None:
                out.append(self._chunk(index, {"content": content} if content else {}, None, lp))
            return out
        rest, calls = stream.finish()
        if content + rest:
            out.append(self._chunk(index, {"content": content + rest}, None, None))
        if calls:
            tool_calls = [
                {"index": k, **call} for k, call in enumerate(answer_calls(calls, job_id, index))
            ]
            out.append(self._chunk(index, {"tool_calls": tool_calls}, None, None))
            finish = "tool_calls"
        out.append(self._chunk(index, {}, finish, lp))
        return out
