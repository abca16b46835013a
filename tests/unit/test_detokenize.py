"""Incremental detokenization with a byte-level BPE, where characters span several tokens."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from worker.engine.detokenize import IncrementalDetokenizer
from worker.model.demo import EOS_TOKEN, load_corpus, train_tokenizer

REPLACEMENT = "\ufffd"
TEXTS = [
    "The weather was fine.",
    "café, naïve, señor, Ærø and façade",
    "日本語のテキストと中文字符",
    "emoji: 😀🎉👩‍👩‍👧 done",
    "mixé 😀 日 the bread ✓ ünïcödé\nnew line",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(load_corpus())


def _stream(tokenizer: Tokenizer, prompt_ids: list[int], ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    return [detok.add(t) for t in ids] + [detok.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_never_split_a_character(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    deltas = _stream(tokenizer, tokenizer.encode("Prompt:").ids, ids)

    assert not any(REPLACEMENT in d for d in deltas)
    assert "".join(deltas) == tokenizer.decode(ids) == text


def test_multibyte_characters_really_span_tokens(tokenizer: Tokenizer) -> None:
    # guards the test above: with this vocabulary an emoji or a CJK character is several
    # byte tokens, and one of them alone decodes to U+FFFD
    for char in ("😀", "日", "é"):
        ids = tokenizer.encode(char, add_special_tokens=False).ids
        assert len(ids) > 1
        assert REPLACEMENT in tokenizer.decode(ids[:1])


def test_special_tokens_add_no_text(tokenizer: Tokenizer) -> None:
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    assert eos_id is not None
    ids = [*tokenizer.encode("Soup 😀", add_special_tokens=False).ids, eos_id]
    deltas = _stream(tokenizer, [], ids)
    assert deltas[-2:] == ["", ""]
    assert "".join(deltas) == "Soup 😀" == tokenizer.decode(ids)


def test_incomplete_character_is_held_until_flush(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("ok 😀", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer, [])
    deltas = [detok.add(t) for t in ids[:-1]]  # the emoji's last byte never comes
    assert "".join(deltas) == "ok "
    tail = detok.flush()
    assert tail.endswith(REPLACEMENT)
    assert "".join(deltas) + tail == tokenizer.decode(ids[:-1])


def test_prompt_context_does_not_leak_into_deltas(tokenizer: Tokenizer) -> None:
    prompt_ids = tokenizer.encode("A long prompt about the river and the sea").ids
    ids = tokenizer.encode(" and the rain", add_special_tokens=False).ids
    assert "".join(_stream(tokenizer, prompt_ids, ids)) == " and the rain"
