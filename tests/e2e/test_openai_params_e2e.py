"""Every parameter of OpenAI's reference, on both text routes, is honoured (200) or refused
with a 400 naming it; and the honoured sampling parameters, log-probabilities and echo do what
they say, through the live embedded platform (real worker, the `openai` client)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from tokenizers import Tokenizer

from sdk import Client
from tests.e2e.openai_helpers import deployed, openai_client

pytestmark = pytest.mark.e2e

MODEL = "params"
MESSAGES = [{"role": "user", "content": "Tell me about the weather."}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

# OpenAI's reference for POST /v1/chat/completions: each parameter with a value a client
# would send that asks for something (not the parameter's "off" value).
CHAT_REFERENCE: dict[str, Any] = {
    "audio": {"voice": "alloy", "format": "wav"},
    "frequency_penalty": 0.5,
    "function_call": "auto",
    "functions": [TOOL["function"]],
    "logit_bias": {"5": 1.0},
    "logprobs": True,
    "max_completion_tokens": 3,
    "max_tokens": 3,
    "metadata": {"purpose": "test"},
    "modalities": ["text", "audio"],
    "n": 2,
    "parallel_tool_calls": True,
    "prediction": {"type": "content", "content": "x"},
    "presence_penalty": 0.5,
    "prompt_cache_key": "k1",
    "prompt_cache_retention": "24h",
    "reasoning_effort": "low",
    "response_format": {"type": "json_object"},
    "safety_identifier": "user-1",
    "seed": 7,
    "service_tier": "flex",
    "stop": ["\n\n"],
    "store": True,
    "stream": True,
    "stream_options": {"include_usage": True},
    "temperature": 0.7,
    "tool_choice": "required",
    "tools": [TOOL],
    "top_logprobs": 2,
    "top_p": 0.9,
    "user": "user-1",
    "verbosity": "low",
    "web_search_options": {},
}
# ... and for POST /v1/completions
COMPLETION_REFERENCE: dict[str, Any] = {
    "best_of": 2,
    "echo": True,
    "frequency_penalty": 0.5,
    "logit_bias": {"5": 1.0},
    "logprobs": 2,
    "max_tokens": 3,
    "n": 2,
    "presence_penalty": 0.5,
    "seed": 7,
    "stop": ["\n\n"],
    "stream": True,
    "stream_options": {"include_usage": True},
    "suffix": " the end",
    "temperature": 0.7,
    "top_p": 0.9,
    "user": "user-1",
}
# Parameters that only mean something beside another one.
NEEDS = {
    "top_logprobs": {"logprobs": True},
    "stream_options": {"stream": True},
    "tool_choice": {"tools": [TOOL]},
    "parallel_tool_calls": {"tools": [TOOL]},
}


@pytest.fixture(scope="module")
def api(platform: dict[str, Any], demo_model: Path) -> dict[str, Any]:
    return deployed(platform, demo_model, MODEL)


def _post(api: dict[str, Any], path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {api['api_key']}"}
    return httpx.post(api["url"] + path, json=body, headers=headers, timeout=120)


@pytest.mark.parametrize(
    ("path", "base", "reference"),
    [
        ("/v1/chat/completions", {"messages": MESSAGES}, CHAT_REFERENCE),
        ("/v1/completions", {"prompt": "The weather"}, COMPLETION_REFERENCE),
    ],
)
def test_every_reference_parameter_is_honoured_or_refused_by_name(
    api: dict[str, Any], path: str, base: dict[str, Any], reference: dict[str, Any]
) -> None:
    verdicts = {}
    for name, value in reference.items():
        body = {"model": MODEL, "max_tokens": 3, **base, **NEEDS.get(name, {}), name: value}
        resp = _post(api, path, body)
        if resp.status_code == 200:
            verdicts[name] = "honoured"
            continue
        assert resp.status_code == 400, (name, resp.status_code, resp.text)
        error = resp.json()["error"]
        assert error["param"] == name, (name, error)
        assert error["code"] == "unsupported_parameter", (name, error)
        assert name in error["message"], (name, error)
        verdicts[name] = "refused"
    # what this platform honours today on both routes (the rest is refused by name)
    for name in ("logit_bias", "logprobs", "seed", "stop", "frequency_penalty", "user", "n"):
        assert verdicts[name] == "honoured", name
    if "tools" in reference:
        for name in ("tools", "tool_choice", "response_format", "parallel_tool_calls"):
            assert verdicts[name] == "honoured", name


def test_an_unknown_parameter_is_refused_by_name(api: dict[str, Any]) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 3, "frobnicate": 1}
    resp = _post(api, "/v1/chat/completions", body)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == ("frobnicate", "unknown_parameter")
    assert error["message"] == "Unrecognized request argument supplied: frobnicate"


@pytest.fixture(scope="module")
def oai(api: dict[str, Any]) -> openai.OpenAI:
    return openai_client(api)


def _greedy_tokens(oai: openai.OpenAI, **extra: Any) -> list[str]:
    resp = oai.completions.create(
        model=MODEL, prompt="The weather", max_tokens=6, temperature=0, logprobs=0, **extra
    )
    assert resp.choices[0].logprobs is not None
    return list(resp.choices[0].logprobs.tokens or [])


def test_logit_bias_and_stop_token_ids_reach_the_sampler(
    oai: openai.OpenAI, demo_model: Path
) -> None:
    tokens = _greedy_tokens(oai)
    assert len(tokens) == 6
    assert oai.models.retrieve(MODEL).id == MODEL
    tokenizer = Tokenizer.from_file(str(demo_model / "tokenizer.json"))
    (first_id,) = tokenizer.encode(tokens[0], add_special_tokens=False).ids
    # the greedy first token banned: another comes first
    assert _greedy_tokens(oai, logit_bias={str(first_id): -100})[0] != tokens[0]
    # a forced token comes out at every step
    assert _greedy_tokens(oai, logit_bias={str(first_id): 100}) == [tokens[0]] * 6
    # generation ends after a stop token, whose text is not part of the output
    stopped = oai.completions.create(
        model=MODEL, prompt="The weather", max_tokens=6, temperature=0,
        extra_body={"stop_token_ids": [first_id]},
    )  # fmt: skip
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].text == ""
    # a token id outside the vocabulary is the caller's error, named
    with pytest.raises(openai.BadRequestError) as bad:
        _greedy_tokens(oai, logit_bias={"99999999": 5})
    assert "logit_bias" in str(bad.value)


def test_sampling_parameters_reach_the_job(api: dict[str, Any]) -> None:
    """Each one is in the job's input, from which the worker builds its sampling."""
    sampling = {"frequency_penalty": 0.5, "presence_penalty": -0.5, "top_k": 5, "min_p": 0.1,
                "repetition_penalty": 1.2, "seed": 3, "temperature": 0.8, "top_p": 0.9}  # fmt: skip
    for path, base in (("/v1/chat/completions", {"messages": MESSAGES}),
                       ("/v1/completions", {"prompt": "The weather"})):  # fmt: skip
        resp = _post(api, path, {"model": MODEL, "max_tokens": 3, **base, **sampling})
        assert resp.status_code == 200, resp.text
        job = httpx.get(
            f"{api['url']}/v1/jobs/{resp.headers['X-Job-Id']}",
            headers={"Authorization": f"Bearer {api['api_key']}"},
        ).json()
        assert {k: job["input"][k] for k in sampling} == sampling
        # a rendered chat holds its template's BOS: the worker adds none
        assert job["input"].get("add_special_tokens", True) is (path == "/v1/completions")


def test_seeded_sampling_repeats_and_top_k_one_is_greedy(oai: openai.OpenAI) -> None:
    def text(**extra: Any) -> str:
        resp = oai.completions.create(model=MODEL, prompt="The weather", max_tokens=8, **extra)
        return resp.choices[0].text

    assert text(temperature=1.0, seed=11) == text(temperature=1.0, seed=11)
    assert text(temperature=1.0, extra_body={"top_k": 1}) == text(temperature=0)


def test_chat_logprobs_plain_and_streamed(oai: openai.OpenAI) -> None:
    messages: Any = MESSAGES
    resp = oai.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, logprobs=True,
        top_logprobs=3,
    )  # fmt: skip
    choice = resp.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert len(content) == resp.usage.completion_tokens  # type: ignore[union-attr]
    # the bytes are exact: together they are the text (random weights may end on part of a
    # character, or emit a special token, which the text leaves out)
    raw = bytes(b for t in content if t.token not in ("<s>", "</s>") for b in t.bytes or [])
    assert raw.decode(errors="replace") == choice.message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # greedy: the token chosen is the most likely one
        assert t.top_logprobs[0].token == t.token
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)
    streamed = []
    for chunk in oai.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, logprobs=True,
        top_logprobs=3, stream=True,
    ):  # fmt: skip
        for c in chunk.choices:
            streamed.extend(c.logprobs.content or [] if c.logprobs else [])
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [
        (t.token, round(t.logprob, 4)) for t in content
    ]


def test_completion_logprobs_and_echo(oai: openai.OpenAI) -> None:
    resp = oai.completions.create(
        model=MODEL, prompt="The weather", max_tokens=6, temperature=0, logprobs=2
    )
    choice = resp.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(alts) == 2 for alts in lp.top_logprobs)

    echoed = oai.completions.create(
        model=MODEL, prompt="The weather", max_tokens=6, temperature=0, echo=True
    )
    assert echoed.choices[0].text == "The weather" + choice.text
    stream = oai.completions.create(
        model=MODEL, prompt="The weather", max_tokens=6, temperature=0, echo=True, stream=True
    )
    streamed = "".join(c.choices[0].text for c in stream if c.choices)
    assert streamed == echoed.choices[0].text
    with pytest.raises(openai.BadRequestError) as both:
        oai.completions.create(model=MODEL, prompt="x", max_tokens=2, echo=True, logprobs=1)
    assert both.value.body["param"] == "echo"  # type: ignore[index]


def test_a_template_file_is_used_and_its_bos_not_doubled(
    api: dict[str, Any], demo_model: Path, tmp_path: Path
) -> None:
    """A model saved by current transformers keeps its template in `chat_template.jinja`; a
    template that writes `{{ bos_token }}` for a tokenizer that adds BOS gives one BOS."""
    model = tmp_path / "templated"
    shutil.copytree(demo_model, model)
    template = (
        "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    )
    (model / "chat_template.jinja").write_text(template)
    Client(base_url=api["url"], api_key=api["api_key"]).deployments.create(
        name="templated", model=str(model), scaledown_window_s=600
    )
    body = {"model": "templated", "messages": MESSAGES, "max_tokens": 2, "temperature": 0}
    resp = _post(api, "/v1/chat/completions", body)
    assert resp.status_code == 200, resp.text
    rendered = "<s>[user] Tell me about the weather.\n"
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    ids = tokenizer.encode(rendered, add_special_tokens=False).ids
    assert ids[0] == tokenizer.token_to_id("<s>") and ids[1] != ids[0]
    assert resp.json()["usage"]["prompt_tokens"] == len(ids)
    # a template that does not finish in time is the caller's 400, and the API serves on
    looping = tmp_path / "looping"
    shutil.copytree(demo_model, looping)
    (looping / "chat_template.jinja").write_text(
        "{% set l = range(100000)|list %}{% for a in l %}{% for b in l %}{% endfor %}{% endfor %}"
    )
    Client(base_url=api["url"], api_key=api["api_key"]).deployments.create(
        name="looping", model=str(looping), scaledown_window_s=600
    )
    slow = _post(api, "/v1/chat/completions", {**body, "model": "looping"})
    assert slow.status_code == 400 and "longer than" in slow.json()["error"]["message"]
    assert _post(api, "/v1/chat/completions", body).status_code == 200


def test_n_choices_share_the_prompt_plain_and_streamed(
    oai: openai.OpenAI, api: dict[str, Any]
) -> None:
    prompt = "The weather today is sunny and warm, with a light breeze from the west and " * 2
    resp = oai.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=1.0, seed=5, n=3, logprobs=1
    )
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert resp.usage is not None
    assert resp.usage.completion_tokens == sum(
        len(c.logprobs.tokens or []) for c in resp.choices if c.logprobs
    )
    # the same seed gives the same choices; greedy choices are all the same
    again = oai.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=1.0, seed=5, n=3
    )
    assert [c.text for c in again.choices] == [c.text for c in resp.choices]
    greedy = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, n=2)
    assert greedy.choices[0].text == greedy.choices[1].text
    # the prompt was computed once: the other choices found its full blocks cached
    raw = _post(api, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 2, "n": 3})
    job = httpx.get(
        f"{api['url']}/v1/jobs/{raw.headers['X-Job-Id']}",
        headers={"Authorization": f"Bearer {api['api_key']}"},
    ).json()
    prompt_tokens = job["usage"]["prompt_tokens"]
    for choice in job["output"]["choices"][1:]:
        assert choice["cached_tokens"] >= prompt_tokens - 16, (choice, prompt_tokens)

    streamed: dict[int, str] = {}
    messages: Any = MESSAGES
    for chunk in oai.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=1.0, seed=5, n=2, stream=True
    ):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    plain = oai.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=1.0, seed=5, n=2
    )
    assert streamed == {c.index: c.message.content for c in plain.choices}


def test_a_list_of_prompts_runs_a_job_each(oai: openai.OpenAI, api: dict[str, Any]) -> None:
    prompts = ["The weather", "A river", "Once upon"]
    resp = oai.completions.create(model=MODEL, prompt=prompts, max_tokens=4, temperature=0, n=2)
    assert [c.index for c in resp.choices] == list(range(6))
    for p, prompt in enumerate(prompts):
        alone = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
        assert resp.choices[2 * p].text == resp.choices[2 * p + 1].text == alone.choices[0].text
    assert resp.usage is not None and resp.usage.prompt_tokens > 0
    streamed: dict[int, str] = {}
    usage = None
    for chunk in oai.completions.create(
        model=MODEL, prompt=prompts, max_tokens=4, temperature=0, n=2, stream=True,
        stream_options={"include_usage": True},
    ):  # fmt: skip
        usage = chunk.usage or usage
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {c.index: c.text for c in resp.choices}
    assert usage is not None and usage.completion_tokens == resp.usage.completion_tokens
    raw = _post(api, "/v1/completions", {"model": MODEL, "prompt": prompts, "max_tokens": 2})
    assert len(raw.headers["X-Job-Ids"].split(",")) == 3
    too_many = _post(api, "/v1/completions", {"model": MODEL, "prompt": ["x"] * 65})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "prompt"
