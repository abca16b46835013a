"""Errors the engine raises for bad requests (before anything is allocated).

ValueError                 bad sampling parameter, empty prompt, token id out of range,
 │                         duplicate request id
 └── PromptTooLongError    prompt + max_tokens exceeds the context window or the KV cache
"""

from __future__ import annotations


class PromptTooLongError(ValueError):
    """The prompt plus ``max_tokens`` does not fit (in the context window, or the KV cache)."""

    def __init__(
        self, prompt_tokens: int, max_tokens: int, limit: int, what: str = "the context window"
    ) -> None:
        super().__init__(
            f"prompt: {prompt_tokens} prompt tokens + max_tokens {max_tokens} exceeds "
            f"{what} of {limit} tokens"
        )
        # prompt length in tokens (bos included)
        self.prompt_tokens = prompt_tokens
        # the request's max_tokens
        self.max_tokens = max_tokens
        # tokens that fit
        self.limit = limit
