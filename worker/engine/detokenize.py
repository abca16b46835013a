"""Incremental detokenization: token ids in, text deltas out, one token at a time.

Decoding token by token is wrong for byte-level and SentencePiece vocabularies: a character may
span several tokens, and a token's leading space depends on its left neighbour. So each step
decodes a short window (``prefix_offset`` .. end) and emits only what the window adds beyond its
already emitted part (``prefix_offset`` .. ``read_offset``), the approach of TGI and vLLM.

NOTE: a delta never ends in U+FFFD: trailing replacement characters (an incomplete UTF-8
sequence) are held back until the next token completes them, or until ``flush()``.

Example:

    >>> detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    >>> text = "".join(detok.add(t) for t in generated_ids) + detok.flush()
    >>> text == tokenizer.decode(generated_ids)
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import tokenizers

# Prompt tokens kept as left context, so the first generated token decodes as it would inside
# the sequence (e.g. SentencePiece's leading-space handling).
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns a stream of generated token ids into text deltas (special tokens skipped)."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, prompt_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        # ids: the prompt tail then every generated id
        self._ids: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        # ids[prefix_offset:read_offset] is context whose text was already emitted (or is prompt)
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def add(self, token_id: int) -> str:
        """Append one generated token; return the text it completes ("" if held back)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""  # nothing new yet, or an incomplete character at the end
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Return whatever is still held back (possibly ending in U+FFFD); call once at the end."""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=True)
