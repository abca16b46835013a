"""Log-probabilities name each token's exact bytes: a character split across tokens is split
across their bytes, never turned into U+FFFD (byte-level BPE and byte-fallback SentencePiece,
the two layouts of the supported families)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from worker.engine.token_bytes import TokenBytes
from worker.model.demo import load_corpus, train_tokenizer

TEXT = "Héllo wörld — ok 日本"


@pytest.fixture(scope="module")
def byte_level() -> Tokenizer:
    return train_tokenizer(load_corpus()[:200])


def _sentencepiece() -> Tokenizer:
    """Llama-2's layout: `▁` for spaces, `<0xNN>` pieces for bytes outside the vocabulary."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ("▁", "H", "l", "o", "▁w", "r", "d", "▁o", "k", "ll"):
        vocab[piece] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab, [("l", "l")], unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tokenizer.add_special_tokens(["<s>", "</s>"])
    return tokenizer


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
def test_the_bytes_of_the_tokens_are_the_text(kind: str, byte_level: Tokenizer) -> None:
    tokenizer = byte_level if kind == "byte_level" else _sentencepiece()
    table = TokenBytes(tokenizer)
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    pieces = [table.text_and_bytes(i) for i in ids]
    assert bytes(b for _, raw in pieces for b in raw).decode() == TEXT
    # some token holds part of a character: its text shows that, its bytes stay exact
    assert any(text == "\ufffd" and len(raw) == 1 for text, raw in pieces)
    # a whole-character token's text is its characters
    assert all(text == bytes(raw).decode() for text, raw in pieces if text != "\ufffd")


def test_special_tokens_are_their_own_text(byte_level: Tokenizer) -> None:
    table = TokenBytes(byte_level)
    bos = byte_level.token_to_id("<s>")
    assert table.text_and_bytes(bos) == ("<s>", list(b"<s>"))
