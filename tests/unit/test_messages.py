"""The wire contract's messages (`common/messages.py`, `common/job_input.py`): one encoding each,
read back to the same object, and anything else refused with the field named."""

from __future__ import annotations

import json

import pytest

from common.job_input import DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE, DEFAULT_TOP_P, JobInput
from common.messages import Assignment, Claim


def test_an_input_takes_the_call_then_the_deployment_then_the_platform() -> None:
    resolved = JobInput.resolve(
        {"prompt": "Hi", "max_tokens": None, "temperature": 0.5, "stop": None},
        {"max_tokens": 9, "temperature": 0.1, "top_p": None},
    )
    assert resolved == JobInput("Hi", max_tokens=9, temperature=0.5, top_p=DEFAULT_TOP_P)
    bare = JobInput.resolve({"prompt": "Hi"}, {})
    assert (bare.max_tokens, bare.temperature, bare.top_p, bare.seed, bare.stop) == (
        DEFAULT_MAX_TOKENS,
        DEFAULT_TEMPERATURE,
        DEFAULT_TOP_P,
        None,
        (),
    )


def test_an_input_reads_back_as_it_was_written() -> None:
    job_input = JobInput("Hi", max_tokens=5, temperature=0.7, top_p=0.9, seed=3, stop=("\n",))
    assert JobInput.from_dict(json.loads(json.dumps(job_input.to_dict()))) == job_input
    assert "seed" not in JobInput("Hi").to_dict()  # unset stays unset in the row
    assert JobInput.from_dict({"prompt": "Hi", "stop": "END"}).stop == ("END",)
    every = JobInput(
        "Hi", top_k=4, min_p=0.1, repetition_penalty=1.1, presence_penalty=0.5,
        frequency_penalty=-0.5, logit_bias=((3, -100.0), (7, 2.5)), stop_token_ids=(2, 9),
        logprobs=3, add_special_tokens=False,
    )  # fmt: skip
    wire = json.loads(json.dumps(every.to_dict()))
    assert wire["logit_bias"] == {"3": -100.0, "7": 2.5}  # OpenAI's shape: string keys
    assert JobInput.from_dict(wire) == every
    # a field at its default is left out of the row; a row without it reads back the same
    assert set(JobInput("Hi").to_dict()) == {"prompt", "max_tokens", "temperature", "top_p", "stop"}


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"max_tokens": 4}, "prompt: must be a string"),
        ({"prompt": "x", "logit_bias": {"-1": 5}}, "logit_bias: must map token ids"),
        ({"prompt": "x", "logit_bias": {"3": "high"}}, "logit_bias: must map token ids"),
        ({"prompt": "x", "stop_token_ids": ["2"]}, "stop_token_ids: must be a list of integers"),
        ({"prompt": "x", "top_k": 2.5}, "top_k: must be an integer"),
        ({"prompt": "x", "add_special_tokens": 0}, "add_special_tokens: must be true or false"),
        ({"prompt": 1}, "prompt: must be a string"),
        ({"prompt": "x", "max_tokens": "4"}, "max_tokens: must be an integer"),
        ({"prompt": "x", "max_tokens": True}, "max_tokens: must be an integer"),
        ({"prompt": "x", "temperature": "hot"}, "temperature: must be a number"),
        ({"prompt": "x", "stop": [1]}, "stop: must be a list of strings"),
    ],
)
def test_a_malformed_input_names_its_field(data: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=f"^{error}"):
        JobInput.from_dict(data)


def test_a_claim_reads_back_as_it_was_written() -> None:
    claim = Claim("job_1", 2, JobInput("Hi", seed=1), 600.0, "demo", "00-ab-cd-01", priority=3)
    assert Claim.from_json(claim.to_json()) == claim
    answer = Claim("job_1", 1, JobInput("Hi"), 30.0, "demo").to_dict()
    assert answer["claimed"] is True and "priority" not in answer  # a claim route's answer
    assert Claim.from_dict(answer).priority is None


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"attempt": "1"}, "attempt: expected an integer"),
        ({"execution_timeout_s": 0}, "execution_timeout_s: expected a number > 0"),
        ({"job_id": ""}, "job_id: expected a non-empty string"),
        ({"input": {"max_tokens": 1}}, "prompt: must be a string"),
    ],
)
def test_a_malformed_claim_is_refused(change: dict[str, object], error: str) -> None:
    good = Claim("job_1", 1, JobInput("Hi"), 30.0, "demo").to_dict()
    with pytest.raises(ValueError, match=error):
        Claim.from_dict({**good, **change})
    with pytest.raises(ValueError, match="not a claim"):
        Claim.from_dict({k: v for k, v in good.items() if k != "deployment"})
    with pytest.raises(ValueError, match="not a claim"):
        Claim.from_json(b"[1, 2]")


def test_an_assignment_reads_back_as_it_was_written() -> None:
    a = Assignment("dep_1", 3, "s3://b/m/", "platform.deployment.dep_1", 4, {"AWS_KEY": "k"})
    assert Assignment.from_json(a.to_json()) == a
    with pytest.raises(ValueError, match="not an assignment"):
        Assignment.from_json('{"deployment_id": "d"}')
    v = Assignment("dep_1", 3, "s3://b/m/", "q", 4, engine="vllm", accelerator_count=2)
    assert Assignment.from_json(v.to_json()) == v
    # written before engines had names: the built-in engine on one accelerator
    old = {
        k: v for k, v in json.loads(a.to_json()).items() if k not in ("engine", "accelerator_count")
    }
    assert Assignment.from_json(json.dumps(old)) == a
    with pytest.raises(ValueError, match="engine: expected one of builtin, vllm"):
        Assignment.from_json(json.dumps({**old, "engine": "tgi"}))
