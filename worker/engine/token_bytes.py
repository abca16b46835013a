"""The text and raw bytes of single tokens, for log-probabilities in OpenAI's shape.

A token need not be whole UTF-8: byte-level BPE (GPT-2, Llama 3, Qwen) and byte-fallback
SentencePiece (Llama 2, Mistral) split a character across tokens. OpenAI reports each token's
`bytes` exactly and its `token` as text; decoding one token alone would turn a partial
character into U+FFFD and lose its bytes, so the bytes are read from the vocabulary:

- byte-level BPE: each character of the token's vocabulary string stands for one byte
  (GPT-2's printable mapping of the 256 byte values);
- SentencePiece: `<0xNN>` is the byte NN, `▁` is a space;
- anything else (special tokens, other decoders): the UTF-8 of the decoded token.

Example:

    >>> table = TokenBytes(tokenizer)
    >>> table.text_and_bytes(token_id)
    ('Hello', [72, 101, 108, 108, 111])
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's reversible map of bytes to printable characters, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _decoder_types(tokenizer: Any) -> set[str]:
    """The decoder's type names (a Sequence decoder lists several)."""
    try:
        spec = json.loads(tokenizer.to_str()).get("decoder") or {}
    except (ValueError, AttributeError):
        return set()
    found = {str(spec.get("type"))}
    for inner in spec.get("decoders") or []:
        found.add(str(inner.get("type")))
    return found


class TokenBytes:
    """Per-token text and bytes of one tokenizer (a `tokenizers.Tokenizer`), cached."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        decoders = _decoder_types(tokenizer)
        self._byte_level = "ByteLevel" in decoders
        self._byte_fallback = "ByteFallback" in decoders or "Metaspace" in decoders
        self._special = {
            token_id
            for token_id, added in (tokenizer.get_added_tokens_decoder() or {}).items()
            if getattr(added, "special", False)
        }
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def text_and_bytes(self, token_id: int) -> tuple[str, list[int]]:
        found = self._cache.get(token_id)
        if found is None:
            raw = self._bytes(token_id)
            found = (raw.decode("utf-8", errors="replace"), list(raw))
            self._cache[token_id] = found
        return found

    def _bytes(self, token_id: int) -> bytes:
        found = self._tokenizer.id_to_token(token_id)
        if found is None or token_id in self._special:
            return str(found or "").encode()
        piece = str(found)
        if self._byte_level:
            table = _byte_level_decoder()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        if self._byte_fallback:
            match = _BYTE_PIECE.fullmatch(piece)
            if match:
                return bytes([int(match.group(1), 16)])
            return piece.replace("\u2581", " ").encode()
        return str(self._tokenizer.decode([token_id], skip_special_tokens=False)).encode()
