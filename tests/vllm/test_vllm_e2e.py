"""Deployments served by vLLM on the embedded platform, end to end: tiny Gemma2 and Mixtral
checkpoints (which the built-in engine does not run) uploaded and deployed with `engine: auto`,
called through the SDK (run, stream), REST async jobs with a signed webhook, a batch and the
`openai` client, greedy text equal to transformers'; a Llama on `engine: vllm` equal to the
same Llama on the built-in engine; cancel, a killed worker, scale to zero and its bill."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from tokenizers import Tokenizer

from common.tokenizer import encode_prompt
from sdk import Client, RunStatus, webhooks
from tests.e2e.conftest import cli, embedded_platform, processes_mentioning
from tests.e2e.openai_helpers import openai_client
from tests.e2e.test_platform_e2e import Receiver

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.e2e

PROMPT = "The weather"
NEW_TOKENS = 12
EOS = 1  # the demo tokenizer's </s>
GREEDY = {"temperature": 0.0, "max_tokens": NEW_TOKENS}


@pytest.fixture(scope="module")
def platform(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    state = tmp_path_factory.mktemp("vllm-platform")
    with embedded_platform(state, {"PLATFORM_VLLM_PYTHON": str(vllm_python)}) as p:
        yield p


@pytest.fixture(scope="module")
def client(platform: dict[str, Any]) -> Client:
    return Client(base_url=platform["url"], api_key=platform["api_key"], timeout=300)


@pytest.fixture(scope="module")
def uploaded(platform: dict[str, Any], tiny_models: dict[str, Path]) -> dict[str, str]:
    """Each tiny checkpoint in the platform's object store, as a tenant uploads it."""
    uris = {}
    for kind, path in tiny_models.items():
        up = cli("models", "upload", str(path), f"models/{kind}/", env=platform["env"])
        assert up.returncode == 0, up.stdout + up.stderr
        uris[kind] = f"store://models/{kind}/"
    return uris


def expected_text(path: Path, prompt: str, max_tokens: int = NEW_TOKENS) -> str:
    """transformers' greedy continuation of `prompt` (tokenized as the platform does), to EOS
    or `max_tokens`, decoded."""
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = encode_prompt(tokenizer, prompt, model.config.bos_token_id)
    new: list[int] = []
    with torch.no_grad():
        while len(new) < max_tokens:
            token = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
            if token == EOS:
                break
            new.append(token)
    return tokenizer.decode(new)


@pytest.mark.parametrize("kind", ["gemma2", "mixtral"])
def test_auto_serves_what_the_builtin_engine_cannot_through_every_door(
    kind: str,
    client: Client,
    platform: dict[str, Any],
    uploaded: dict[str, str],
    tiny_models: dict[str, Path],
    tmp_path: Path,
) -> None:
    name = f"tiny-{kind}"
    dep = client.deployments.create(name=name, model=uploaded[kind], scaledown_window_s=600)
    assert dep.engine_resolved == "vllm", dep
    assert dep.engine_reason and "vLLM" in dep.engine_reason
    expected = expected_text(tiny_models[kind], PROMPT)

    text = client.run(name, input={"prompt": PROMPT, **GREEDY})
    assert text == expected
    deltas = list(client.run(name, input={"prompt": PROMPT, **GREEDY}, stream=True))
    assert len(deltas) >= 2 and "".join(deltas) == expected

    receiver = Receiver()
    try:
        job = client.submit(name, input={"prompt": PROMPT, **GREEDY}, webhook=receiver.url)
        assert receiver.arrived.wait(120), "webhook did not arrive"
        body, headers = receiver.deliveries[0]
        event = webhooks.verify(body, headers, client.webhooks.secret())
        assert event["data"]["id"] == job.id and event["data"]["status"] == "succeeded"
        assert event["data"]["output"]["text"] == expected
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()

    source = tmp_path / "in.jsonl"
    source.write_text(f'{{"prompt": "{PROMPT}", "temperature": 0, "max_tokens": {NEW_TOKENS}}}\n')
    batch = client.batches.create(source, deployment=name, max_in_flight=1)
    batch.wait(timeout=300)
    assert batch.status == "completed" and batch.counts["succeeded"] == 1
    with batch.results() as results:
        assert [line["output"]["text"] for line in results] == [expected]

    completion = openai_client(platform).completions.create(
        model=name, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0
    )
    assert completion.choices[0].text == expected
    assert completion.usage is not None and completion.usage.completion_tokens >= 1


@pytest.fixture(scope="module")
def llamas(client: Client, uploaded: dict[str, str]) -> tuple[str, str]:
    """The same Llama deployed on each engine, kept warm for the module."""
    builtin = client.deployments.create(
        name="llama-builtin", model=uploaded["llama"], engine="builtin", scaledown_window_s=600
    )
    on_vllm = client.deployments.create(
        name="llama-vllm", model=uploaded["llama"], engine="vllm", scaledown_window_s=600
    )
    assert (builtin.engine_resolved, on_vllm.engine_resolved) == ("builtin", "vllm")
    return "llama-builtin", "llama-vllm"


def test_a_llama_on_vllm_answers_as_on_the_builtin_engine(
    client: Client, llamas: tuple[str, str], tiny_models: dict[str, Path]
) -> None:
    for prompt in (PROMPT, "A good soup needs"):
        ours = client.run("llama-builtin", input={"prompt": prompt, **GREEDY})
        theirs = client.run("llama-vllm", input={"prompt": prompt, **GREEDY})
        assert ours == theirs == expected_text(tiny_models["llama"], prompt)
    # a stop string found in the text ends the request there, on either engine
    stop = ours[len(ours) // 2 : len(ours) // 2 + 2]
    stopped = [
        client.run(name, input={"prompt": "A good soup needs", **GREEDY, "stop": [stop]})
        for name in ("llama-builtin", "llama-vllm")
    ]
    assert stopped[0] == stopped[1] == ours[: ours.index(stop)]
    # the sampling parameters the OpenAI routes pass: structured outputs, n, logprobs, ...
    special = {
        "prompt": PROMPT,
        **GREEDY,
        "structured": {"choice": ["sunny", "rain"]},
        "n": 2,
        "logprobs": 2,
        "presence_penalty": 0.5,
    }
    jobs = [client.submit(name, input=special) for name in llamas]
    outputs = [job.wait(timeout=300).output for job in jobs]
    assert outputs[0] is not None and outputs[1] is not None
    assert outputs[0]["text"] in ("sunny", "rain")
    for key in ("text", "finish_reason"):
        assert outputs[0][key] == outputs[1][key]
    assert [c["text"] for c in outputs[1]["choices"]] == [outputs[0]["text"]] * 2
    tokens = [[(lp["token"], len(lp["top_logprobs"])) for lp in o["logprobs"]] for o in outputs]
    # vLLM samples the end-of-sequence token once the grammar is complete (the built-in engine
    # ends there): its entry comes last, nothing else differs
    assert tokens[1][: len(tokens[0])] == tokens[0] and len(tokens[1]) <= len(tokens[0]) + 1
    assert all(n == 2 for _, n in tokens[1])


def _worker_metric(platform: dict[str, Any], deployment: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {platform['api_key']}"}
    groups = httpx.get(f"{platform['url']}/metrics/workers", headers=headers).json()
    targets = [g["targets"][0] for g in groups if g["labels"].get("deployment") == deployment]
    for family in text_string_to_metric_families(httpx.get(f"http://{targets[0]}/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not in the worker's metrics")


LONG = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0.0, "logit_bias": {str(EOS): -100}}


def test_cancel_mid_stream_aborts_the_request_inside_vllm(
    client: Client, platform: dict[str, Any], llamas: tuple[str, str]
) -> None:
    assert client.run("llama-vllm", input={"prompt": PROMPT, **GREEDY})  # a worker is up
    # LONG takes 0.6-3 s here: on a loaded machine it may end before the cancel lands. The
    # metric is judged only when the cancel did land: the request was inside vLLM until then,
    # so also when the metric was read.
    for _ in range(5):
        with client.run("llama-vllm", input=LONG, stream=True) as stream:
            assert next(iter(stream))  # generating
            assert stream.job_id is not None
            running = _worker_metric(platform, "llama-vllm", "platform_worker_requests_running")
            client.jobs.cancel(stream.job_id)
            deadline = time.monotonic() + 60
            ended = ("canceled", "succeeded")
            while (status := client.jobs.get(stream.job_id).status) not in ended:
                assert time.monotonic() < deadline, f"the job did not end ({status})"
                time.sleep(0.2)
        if status == "canceled":
            break
    else:
        pytest.fail("every request ended before its cancel landed")
    assert running == 1
    deadline = time.monotonic() + 10
    while _worker_metric(platform, "llama-vllm", "platform_worker_requests_running"):
        assert time.monotonic() < deadline, "vLLM still runs the canceled request"
        time.sleep(0.2)
    assert _worker_metric(platform, "llama-vllm", "platform_worker_kv_cache_usage_ratio") == 0


def test_the_job_of_a_killed_vllm_worker_is_retried_once(
    client: Client, platform: dict[str, Any], llamas: tuple[str, str], tiny_models: dict[str, Path]
) -> None:
    assert client.run("llama-vllm", input={"prompt": PROMPT, **GREEDY})
    # the worker fills the disk tier once it is idle: the next worker reads it
    weights = (tiny_models["llama"] / "model.safetensors").read_bytes()
    deadline = time.monotonic() + 60
    while not any(
        p.read_bytes() == weights
        for p in (platform["state_dir"] / "weights-cache").glob("*.safetensors")
    ):
        assert time.monotonic() < deadline, "the disk tier was never filled"
        time.sleep(0.2)
    ids = {w["id"] for w in client.workers.list("llama-vllm") if w["state"] in ("idle", "busy")}
    victim = [p for i in ids for p in processes_mentioning(i) if "-m worker" in p]
    assert len(victim) == 1
    job = client.submit("llama-vllm", input=LONG)
    deadline = time.monotonic() + 60
    while client.jobs.get(job.id).status != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(int(victim[0].split(":")[0]), signal.SIGKILL)
    final = job.wait(timeout=300)
    assert final.status == "succeeded" and final.attempt == 2
    assert final.output is not None
    assert final.output["text"] == client.run("llama-vllm", input=LONG)
    # the new worker read the weights from a cache tier the first one filled, not storage
    assert _worker_metric(platform, "llama-vllm", "platform_worker_load_cache_hits_total") >= 1


def test_a_vllm_deployment_scales_to_zero_with_a_clean_bill(
    client: Client, platform: dict[str, Any], uploaded: dict[str, str], tiny_models: dict[str, Path]
) -> None:
    client.deployments.create(
        name="vllm-zero", model=uploaded["llama"], engine="vllm", scaledown_window_s=15
    )
    assert client.workers.list(deployment="vllm-zero") == []
    seen: list[RunStatus] = []
    stream = client.run(
        "vllm-zero", {"prompt": PROMPT, **GREEDY}, stream=True, on_status=seen.append
    )
    assert "".join(stream)
    # the caller saw the cold start's progress: the boot, then the weights (vLLM's engine
    # start is part of the load), their bytes counted by the platform's loader
    phases = [s.phase for s in seen if s.status == "starting"]
    assert "booting" in phases and "loading_weights" in phases, phases
    size = sum(f.stat().st_size for f in tiny_models["llama"].glob("*.safetensors"))
    totals = {s.bytes_total for s in seen if s.bytes_total is not None}
    assert totals and all(0 < t <= size for t in totals), (totals, size)
    deadline = time.monotonic() + 120
    while any(w["state"] not in ("stopped", "failed") for w in client.workers.list("vllm-zero")):
        assert time.monotonic() < deadline, "did not scale to zero"
        time.sleep(0.5)
    assert [w["state"] for w in client.workers.list("vllm-zero")] == ["stopped"]
    records = client.billing.records(deployment="vllm-zero")
    phases = [r["phase"] for r in records]
    assert phases[0] in ("boot", "load") and "busy" in phases and phases[-1] == "drain", phases
    assert all(Decimal(r["amount"]) >= 0 for r in records)
    check = httpx.get(
        platform["url"] + "/v1/billing/check",
        headers={"Authorization": f"Bearer {platform['api_key']}"},
    ).json()
    assert check["ok"], check
