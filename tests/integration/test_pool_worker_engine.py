"""A warm-pool worker prepares one engine and serves only deployments on it (real Redis; the
control plane faked, the engine's preparation recorded instead of importing vLLM):
`python -m worker --pool --engine vllm` prepares vLLM while it waits, takes an assignment on
vLLM, and fails, saying why, on one for another engine. Any worker beats before that
preparation (its imports take seconds) and has it set torch's threads."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest

from common.messages import Assignment
from common.protocol import worker_assignment_key, worker_heartbeat_key
from tests.unit.test_engine_worker_runtime import FakeControl
from worker import __main__ as worker_main
from worker.runtime import engine_setup, lifecycle, warm_pool
from worker.runtime.lifecycle import WorkerRuntime
from worker.settings import WorkerSettings


class ReasonsControl(FakeControl):
    """The fake control plane, keeping each state report's reason."""

    def __init__(self) -> None:
        super().__init__({})
        self.reasons: list[str | None] = []

    def report_state(
        self, state: str, reason: str | None = None, *, takes_handoffs: bool = False
    ) -> None:
        super().report_state(state, reason, takes_handoffs=takes_handoffs)
        self.reasons.append(reason)


Prepared = list[tuple[str, bool, str, int]]


@pytest.fixture
def prepared(monkeypatch: pytest.MonkeyPatch) -> Prepared:
    """Each `prepare_runtime(accelerator, collect, engine, threads)` call, recorded (no
    imports); the worker's signal handlers left to pytest."""
    calls: Prepared = []

    def prepare(accelerator: str, collect: bool, engine: str = "builtin", threads: int = 0) -> None:
        calls.append((accelerator, collect, engine, threads))

    monkeypatch.setattr(engine_setup, "prepare_runtime", prepare)
    monkeypatch.setattr(lifecycle, "on_signals", lambda action: lambda: None)
    return calls


def pool_worker(redis_url: str, worker_id: str, engine: str) -> WorkerRuntime:
    rt = WorkerRuntime(WorkerSettings(redis_url=redis_url), worker_id, "cpu", pool_engine=engine)
    rt.control = rt.jobs.control = ReasonsControl()  # type: ignore[assignment]
    return rt


def test_a_vllm_pool_worker_prepares_vllm_and_takes_a_vllm_assignment(
    redis_url: str, redis_client: Any, prepared: Prepared
) -> None:
    rt = pool_worker(redis_url, "wrk_pv", "vllm")
    sent = Assignment("dep_v", 3, "file:///m", "q", 1, engine="vllm")
    redis_client.rpush(worker_assignment_key("wrk_pv"), sent.to_json())
    got = rt._wait_in_pool()
    assert got == sent
    # vLLM's imports paid in the pool (collecting their garbage: nobody waits yet)
    assert prepared == [("cpu", True, "vllm", 1)]  # PLATFORM_WORKER_THREADS' default
    assert rt.control.states == ["idle"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("pool_engine", "sent_engine"), [("vllm", "builtin"), ("builtin", "vllm")])
def test_a_pool_worker_fails_on_an_assignment_for_another_engine(
    redis_url: str,
    redis_client: Any,
    prepared: Prepared,
    pool_engine: str,
    sent_engine: str,
) -> None:
    rt = pool_worker(redis_url, "wrk_px", pool_engine)
    sent = Assignment("dep_x", 1, "file:///m", "q", 1, engine=sent_engine)
    redis_client.rpush(worker_assignment_key("wrk_px"), sent.to_json())
    assert rt.run() == 1
    assert prepared == [("cpu", True, pool_engine, 1)]
    control: ReasonsControl = rt.control  # type: ignore[assignment]
    assert control.states == ["idle", "failed"]
    reason = control.reasons[-1]
    assert reason is not None and reason.startswith("EngineMismatch: deployment dep_x")
    assert f"on engine {sent_engine!r}" in reason and f"prepared engine {pool_engine!r}" in reason
    assert rt.assignment is None  # it never took the deployment on


def test_a_worker_beats_before_it_prepares_its_runtime(
    redis_url: str, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    beats: list[bytes | None] = []  # the heartbeat in Redis as the preparation begins

    def prepare(accelerator: str, collect: bool, engine: str = "builtin", threads: int = 0) -> None:
        beats.append(redis_client.get(worker_heartbeat_key("wrk_early")))
        raise RuntimeError(f"stopped here ({threads} threads)")

    monkeypatch.setattr(engine_setup, "prepare_runtime", prepare)
    monkeypatch.setattr(lifecycle, "on_signals", lambda action: lambda: None)
    settings = WorkerSettings(redis_url=redis_url, worker_threads=3)
    rt = WorkerRuntime(settings, "wrk_early", "cpu", Assignment("dep_e", 1, "file:///m", "q", 1))
    rt.control = rt.jobs.control = ReasonsControl()  # type: ignore[assignment]
    assert rt.run() == 1
    assert beats[0] is not None, "no heartbeat before the runtime's imports"
    assert json.loads(beats[0])["state"] == "booting"
    assert rt.control.reasons[-1] == "RuntimeError: stopped here (3 threads)"  # type: ignore[attr-defined]


def test_check_engine_names_both_engines() -> None:
    a = Assignment("dep_1", 1, "file:///m", "q", 1, engine="vllm")
    warm_pool.check_engine(a, "vllm")
    with pytest.raises(warm_pool.EngineMismatch, match=r"'vllm'.*'builtin'"):
        warm_pool.check_engine(a, "builtin")


class Recorded:
    """Stands in for WorkerRuntime in `python -m worker`: records what it was built with."""

    made: ClassVar[list[tuple[Any, ...]]] = []

    def __init__(self, *args: Any) -> None:
        Recorded.made.append(args[1:])

    def run(self) -> int:
        return 0


@pytest.fixture
def main_recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    Recorded.made = []
    monkeypatch.setattr(worker_main, "WorkerRuntime", Recorded)
    for name in ("configure", "set_process_fields"):
        monkeypatch.setattr(worker_main.logs, name, lambda *a, **k: None)
    monkeypatch.setattr(worker_main.tracing, "configure", lambda *a, **k: None)
    return Recorded.made


def test_the_engine_flag_sets_the_pool_workers_engine(
    main_recorded: list[tuple[Any, ...]],
) -> None:
    assert worker_main.main(["--worker-id", "wrk_1", "--pool", "--engine", "vllm"]) == 0
    assert worker_main.main(["--worker-id", "wrk_2", "--pool"]) == 0
    assert main_recorded == [("wrk_1", "cpu", None, "vllm"), ("wrk_2", "cpu", None, "builtin")]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--engine", "vllm"], "--engine is for --pool workers"),
        (["--pool", "--engine", "sglang"], "invalid choice: 'sglang'"),
    ],
)
def test_a_wrong_engine_flag_is_a_usage_error(
    main_recorded: list[tuple[Any, ...]],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    says: str,
) -> None:
    with pytest.raises(SystemExit) as exit_:
        worker_main.main(["--worker-id", "wrk_1", *argv])
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err
    assert main_recorded == []
