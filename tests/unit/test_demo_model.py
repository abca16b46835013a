"""The demo checkpoint, and the generate loop's finish reasons on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file
from tokenizers import Tokenizer

from common.model_config import ModelConfig
from worker.engine.generate import NO_TOKEN, Generator, PromptTooLongError
from worker.engine.sampling import SamplingParams
from worker.engine.stop import StopMatcher
from worker.model.demo import FILE_NAMES, create_demo_model, main
from worker.model.weights import build_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_demo_model(tmp_path_factory.mktemp("demo"), seed=0, train_steps=0)


def _generator(checkpoint: Path, eos_token_ids: tuple[int, ...] = ()) -> Generator:
    """A generator on the demo model; no eos by default, so random weights run to the end."""
    config = ModelConfig.from_hf_dict(json.loads((checkpoint / "config.json").read_text()))
    model = build_model(config, load_file(str(checkpoint / "model.safetensors")))
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    return Generator(model, tokenizer, eos_token_ids, config.max_position_embeddings)


def test_writes_the_five_files(checkpoint: Path) -> None:
    assert sorted(p.name for p in checkpoint.iterdir()) == sorted(FILE_NAMES)
    config = ModelConfig.from_hf_dict(json.loads((checkpoint / "config.json").read_text()))
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (64, 176, 2)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.max_position_embeddings == 512
    assert not config.tie_word_embeddings
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    assert config.vocab_size == tokenizer.get_vocab_size() == 512
    assert config.bos_token_id == tokenizer.token_to_id("<s>")
    assert config.eos_token_ids == (tokenizer.token_to_id("</s>"),)
    tok_config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_training_is_deterministic(tmp_path: Path) -> None:
    heard: list[str] = []
    a = create_demo_model(tmp_path / "a", seed=5, train_steps=2, progress=heard.append)
    b = create_demo_model(tmp_path / "b", seed=5, train_steps=2)
    # each step is told (`platform models create-demo` prints them), and changes nothing
    assert [line.split(":")[0].split(" ")[0] for line in heard] == [
        "training",
        "training",
        "",
        "",
        "writing",
    ]
    c = create_demo_model(tmp_path / "c", seed=5, train_steps=0)
    for name in FILE_NAMES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_encode_adds_bos_once(checkpoint: Path) -> None:
    generator = _generator(checkpoint)
    bos = generator.model.config.bos_token_id
    ids = generator.encode("Hello there")
    assert ids[0] == bos
    assert ids[1] != bos
    assert generator.encode("") == [bos]


def test_max_tokens_finishes_with_length(checkpoint: Path) -> None:
    generator = _generator(checkpoint)
    steps = list(generator.generate("The morning was", SamplingParams(max_tokens=12)))
    assert len(steps) == 12
    assert [s.finished for s in steps] == [False] * 11 + [True]
    assert steps[-1].finish_reason == "length"
    assert all(s.finish_reason is None for s in steps[:-1])

    result = generator.run("The morning was", SamplingParams(max_tokens=12))
    assert result.finish_reason == "length"
    assert result.generated_tokens == 12
    assert result.prompt_tokens == len(generator.encode("The morning was"))
    tokens = [s.token_id for s in steps]
    assert result.text == "".join(s.text_delta for s in steps)
    assert result.text == generator.tokenizer.decode(tokens)


def test_eos_finishes_with_stop(checkpoint: Path) -> None:
    first = next(iter(_generator(checkpoint).generate("Bread", SamplingParams(max_tokens=5))))
    # make the greedy first token an eos token: generation stops right after it
    generator = _generator(checkpoint, eos_token_ids=(first.token_id,))
    steps = list(generator.generate("Bread", SamplingParams(max_tokens=5)))
    assert len(steps) == 1
    assert steps[0].token_id == first.token_id
    assert (steps[0].finished, steps[0].finish_reason) == (True, "stop")
    result = generator.run("Bread", SamplingParams(max_tokens=5))
    assert (result.finish_reason, result.generated_tokens) == ("stop", 1)


def test_stop_string_ends_generation_and_is_cut(checkpoint: Path) -> None:
    generator = _generator(checkpoint)
    full = generator.run("The river", SamplingParams(max_tokens=40)).text
    # a short, clean substring from the middle of the greedy output as the stop string
    start = next(
        i
        for i in range(4, len(full) - 2)
        if full[i : i + 2].isprintable() and "\ufffd" not in full[i : i + 2]
    )
    stop = full[start : start + 2]
    expected = full[: full.index(stop)]

    steps = list(generator.generate("The river", SamplingParams(max_tokens=40, stop=(stop,))))
    assert steps[-1].finished
    assert steps[-1].finish_reason == "stop"
    assert "".join(s.text_delta for s in steps) == expected
    assert len(steps) < 40
    result = generator.run("The river", SamplingParams(max_tokens=40, stop=("zzz", stop)))
    assert (result.text, result.finish_reason) == (expected, "stop")


def test_stop_matcher_holds_back_possible_stop_prefixes() -> None:
    matcher = StopMatcher(("END", "\n\n"))
    assert matcher.feed("abc E") == ("abc ", False)  # "E" may begin "END"
    assert matcher.feed("N") == ("", False)
    assert matcher.feed("x\n") == ("ENx", False)  # not "END" after all; "\n" held
    assert matcher.feed("\nmore") == ("", True)
    tail = StopMatcher(("END",))
    assert tail.feed("the EN") == ("the ", False)
    assert tail.flush() == "EN"  # generation ended without a stop: nothing is lost


def test_seeded_sampling_is_reproducible(checkpoint: Path) -> None:
    generator = _generator(checkpoint)
    params = SamplingParams(max_tokens=15, temperature=1.0, top_p=0.9, seed=-3)
    first = generator.run("Rain", params)
    assert first == generator.run("Rain", params)
    assert first.text != generator.run("Rain", SamplingParams(max_tokens=15)).text


def test_abort(checkpoint: Path) -> None:
    generator = _generator(checkpoint)
    calls = 0

    def should_abort() -> bool:
        nonlocal calls
        calls += 1
        return calls > 3

    steps = list(generator.generate("Snow", SamplingParams(max_tokens=20), should_abort))
    assert len(steps) == 4
    assert steps[-1].token_id == NO_TOKEN
    assert (steps[-1].finished, steps[-1].finish_reason) == (True, "abort")
    assert not any(s.finished for s in steps[:-1])


def test_prompt_too_long(checkpoint: Path) -> None:
    generator = _generator(checkpoint)
    prompt = "the rain on the roof " * 200
    with pytest.raises(PromptTooLongError) as info:
        generator.generate(prompt, SamplingParams(max_tokens=8))
    assert isinstance(info.value, ValueError)
    assert info.value.prompt_tokens == len(generator.encode(prompt))
    assert info.value.limit == 512

    fits = generator.encode("hello")
    with pytest.raises(PromptTooLongError):
        generator.validate(fits, SamplingParams(max_tokens=512 - len(fits) + 1))
    generator.validate(fits, SamplingParams(max_tokens=512 - len(fits)))
    with pytest.raises(ValueError, match="prompt"):
        generator.validate([], SamplingParams())


def test_cli_writes_and_prints_a_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main([str(tmp_path / "cli"), "--train-steps", "0", "--seed", "1"])
    out = capsys.readouterr().out
    assert "wrote config.json" in out
    assert "sample (" in out
    assert (tmp_path / "cli" / "model.safetensors").exists()
