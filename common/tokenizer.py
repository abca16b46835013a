"""A prompt's token ids as the engine sees them, for the API's count at the edge and the worker
alike (both load the model's `tokenizer.json` with the `tokenizers` library; no torch).

The model's beginning-of-sequence token starts every prompt when the model has one: the
tokenizer's post-processor adds it for most models; for the others it is prepended here, never
twice (`transformers` does the same for these families).
"""

from __future__ import annotations

from typing import Any


def encode_prompt(
    tokenizer: Any, prompt: str, bos_token_id: int | None, add_special_tokens: bool = True
) -> list[int]:
    """Token ids of `prompt` (`tokenizer`: a `tokenizers.Tokenizer`), starting with
    `bos_token_id` when the model has one. With `add_special_tokens` False the text is
    tokenized as it is (a chat rendered by the model's template holds its own BOS: adding one
    would give two, which transformers' `apply_chat_template` avoids the same way)."""
    if not add_special_tokens:
        plain: list[int] = tokenizer.encode(prompt, add_special_tokens=False).ids
        return plain
    ids: list[int] = tokenizer.encode(prompt, add_special_tokens=True).ids
    if bos_token_id is not None and (not ids or ids[0] != bos_token_id):
        ids.insert(0, bos_token_id)  # the tokenizer's post-processor did not add it
    return ids
