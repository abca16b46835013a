"""What the fault scenarios share: their sizes, marks and invariants, a steady client that
submits jobs through the SDK, a read-only view of the platform's ledger, the base of their
fault injectors, and the record of one run for the summary.

    Sizes.from_env(), SIZES   FAULTS_JOBS, FAULTS_WORKER_KILLS, FAULTS_REDIS_RESTARTS,
                              FAULTS_COLD_START_KILLS, FAULTS_CALLER_FAULTS, FAULTS_MAX_TOKENS
                              (short defaults; `make faults` sets long ones)
    scenario_marks()          a scenario module's pytestmark: faults, e2e and its timeout
    INVARIANTS                what every scenario checks (invariants/), one test each
    Submitter                 a thread: submits jobs, at most `window` unfinished at a time;
                              only a 201/202 makes a job admitted
    Ledger (ledger.py)        SQL reads the scenarios need (running jobs and their worker's pid,
                              completions after an instant)
    Injector                  base of a scenario's fault: an SDK client of the platform and the
                              probes' outcomes, closed with it
    upload_model()            a model put in the platform's store (a store:// URI to deploy)
    log_after(), wait_for_log()  a process's log written after an offset; waiting for a line
    run_scenario()            the shape every scenario shares: deploy, warm, submit while
                              injecting faults spread over the run, then the checker
    FaultRun, RUNS            one scenario's numbers; conftest prints RUNS at the end
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import pytest

from sdk import APIError, Client, PlatformError
from tests.faults.invariants import (
    Bounds,
    Evidence,
    Violation,
    WebhookEvidence,
    check,
)
from tests.faults.ledger import Ledger
from tests.faults.receiver import Plan, WebhookReceiver
from tests.helpers import wait_for

# Prompts of the jobs (never logged; the outputs are not read at all).
PROMPTS = ("The weather", "A good soup", "Once upon a time", "The river")


@dataclass(frozen=True, slots=True)
class Sizes:
    """How big a run is. The defaults are the short forms `pytest` runs (both scenarios well
    under 3 minutes on a 2-core CPU); `make faults` passes the long ones."""

    jobs: int = 12  # jobs submitted per scenario
    worker_kills: int = 2  # SIGKILLs of a worker running a job
    redis_restarts: int = 1  # SIGKILLs of redis-server (the supervisor restarts it)
    control_plane_kills: int = 3  # SIGKILLs of the API, Celery and the reconciler, in turn
    cold_start_kills: int = 2  # SIGKILLs of a worker loading its weights or warming up, in turn
    max_tokens: int = 24  # tokens per job: the demo model is untrained, it uses them all
    network_faults: int = 5  # worker↔Redis / worker↔S3 faults, each kind in turn
    caller_faults: int = 4  # worker, Redis, API, Celery kills in turn, callers in flight

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Sizes:
        d = cls()
        return cls(
            jobs=int(env.get("FAULTS_JOBS", d.jobs)),
            worker_kills=int(env.get("FAULTS_WORKER_KILLS", d.worker_kills)),
            redis_restarts=int(env.get("FAULTS_REDIS_RESTARTS", d.redis_restarts)),
            control_plane_kills=int(env.get("FAULTS_CONTROL_PLANE_KILLS", d.control_plane_kills)),
            cold_start_kills=int(env.get("FAULTS_COLD_START_KILLS", d.cold_start_kills)),
            max_tokens=int(env.get("FAULTS_MAX_TOKENS", d.max_tokens)),
            network_faults=int(env.get("FAULTS_NETWORK_FAULTS", d.network_faults)),
            caller_faults=int(env.get("FAULTS_CALLER_FAULTS", d.caller_faults)),
        )

    def timeout_s(self) -> float:
        """A pytest timeout that no healthy run of these sizes comes near."""
        faults = (
            self.worker_kills
            + self.redis_restarts
            + self.control_plane_kills
            + self.cold_start_kills
            + self.caller_faults
        )
        return 600 + 3 * self.jobs + 60 * faults


# This run's sizes (a scenario with counts of its own reads them from the environment too).
SIZES = Sizes.from_env()
# Every scenario checks every invariant of invariants/.
INVARIANTS = ("I1", "I2", "I3", "I4", "I5", "I6")


def scenario_marks(timeout_s: float = SIZES.timeout_s()) -> list[pytest.MarkDecorator]:
    """A scenario module's `pytestmark`: in the fault suite, on the embedded platform, and a
    timeout no healthy run of its size comes near."""
    return [pytest.mark.faults, pytest.mark.e2e, pytest.mark.timeout(timeout_s)]


class Submitter(threading.Thread):
    """Submits `total` async jobs to `deployment`, at most `window` of them unfinished at once,
    through each of `clients` in turn (several API hosts: tests/hosts).

    A job is admitted only when the SDK returned it (201/202, after its own retries with one
    idempotency key); anything else (a 503 while Redis is down, a refused connection) is
    counted by cause in `refused` and not retried further: the run then admits fewer jobs.
    """

    def __init__(
        self,
        clients: Sequence[Client],
        ledger: Ledger,
        deployment: str,
        total: int,
        max_tokens: int,
        *,
        window: int = 4,
        webhook: str | None = None,
    ) -> None:
        super().__init__(name=f"submit-{deployment}", daemon=True)
        self.clients, self.ledger, self.deployment = clients, ledger, deployment
        self.total, self.max_tokens, self.window, self.webhook = total, max_tokens, window, webhook
        self.admitted: list[str] = []
        self.refused: Counter[str] = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for n in range(self.total):
                while self.ledger.unfinished(self.admitted[-4 * self.window :]) >= self.window:
                    time.sleep(0.1)
                self._submit_one(n)
        except BaseException as e:  # surfaced by the scenario, not lost in a thread
            self.error = e

    def _submit_one(self, n: int) -> None:
        prompt = PROMPTS[n % len(PROMPTS)]
        try:
            job = self.clients[n % len(self.clients)].submit(
                self.deployment,
                input={"prompt": prompt, "max_tokens": self.max_tokens},
                webhook=self.webhook,
            )
        except APIError as e:
            self.refused[f"HTTP {e.status}"] += 1
            time.sleep(0.2)
        except PlatformError as e:
            self.refused[type(e).__name__] += 1
            time.sleep(0.2)
        else:
            self.admitted.append(job.id)


class Injector:
    """Base of a scenario's fault, `run_scenario`'s `inject(ledger, deployment)`: it does one
    fault and returns when it happened (None: it found nothing to break). It holds an SDK
    client of the platform (the probe after a fault, jobs of its own), closed with it.

    Example: `with RedisKiller(platform) as killer: run_scenario(..., killer)`.
    """

    def __init__(self, platform: dict[str, Any], timeout_s: float = 30.0) -> None:
        self.client = Client(
            base_url=platform["url"], api_key=platform["api_key"], timeout=timeout_s
        )
        self.probes: list[str] = []  # per fault: how the sync call after it went

    def __call__(self, ledger: Ledger, deployment: str) -> datetime | None:
        raise NotImplementedError

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def upload_model(platform: dict[str, Any], model: Path, prefix: str) -> str:
    """`model`'s files put in the operator's store under `prefix` (through the SDK); the
    store:// URI to deploy them from."""
    with Client(base_url=platform["url"], api_key=platform["api_key"], timeout=60) as c:
        return c.files.upload_dir(model, prefix)


def wait_recovered(
    ledger: Ledger, deployment: str, fault_at: datetime, timeout_s: float
) -> float | None:
    """Seconds from a fault to the deployment's next job picked up and succeeded after it
    (None: none in time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = ledger.first_success_after(deployment, fault_at)
        if done is not None:
            return (done - fault_at).total_seconds()
        time.sleep(0.1)
    return None


def wait_finished(ledger: Ledger, deployment: str, at_least: int, timeout_s: float) -> bool:
    """Until `at_least` of the deployment's jobs ended (False: not in time)."""
    deadline = time.monotonic() + timeout_s
    while ledger.finished(deployment) < at_least:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def submit_long_job(client: Client, deployment: str, sizes: Sizes) -> str:
    """An async job four times the scenario's length, for a fault that found nothing running
    to act on (every submitted job ended before its turn): its id."""
    job = client.submit(
        deployment, input={"prompt": "The river", "max_tokens": 4 * sizes.max_tokens}
    )
    return str(job.id)


def probe(client: Client, deployment: str, fault: str) -> str:
    """A sync call right after a fault: a job picked up after it by construction (the
    scenario's own may all be running already), which recovery is measured to. "ok", or
    what it failed with."""
    try:
        client.run(deployment, input={"prompt": "The river", "max_tokens": 1})
        return "ok"
    except APIError as e:
        return f"{fault}: HTTP {e.status}"


def utcnow() -> datetime:
    return datetime.now(UTC)


def log_after(path: Path, offset: int) -> str:
    """What was written to the log `path` past `offset` bytes."""
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def wait_for_log(path: Path, offset: int, needle: str, timeout_s: float) -> str:
    """Until `needle` is in the log `path` past `offset`: what was written there by then."""

    def written() -> str | None:
        text = log_after(path, offset)
        return text if needle in text else None

    return wait_for(written, timeout_s, every_s=0.1, what=f"{needle!r} in {path.name}")


@dataclass(slots=True)
class FaultRun:
    """One scenario's numbers, as the summary table and docs/reliability.md show them."""

    scenario: str  # test module name
    faults: int = 0  # faults injected
    admitted: int = 0  # jobs the client got 201/202 for
    refused: Counter[str] = field(default_factory=Counter)  # submits not admitted, by cause
    statuses: Counter[str] = field(default_factory=Counter)  # final status of admitted jobs
    recoveries_s: list[float] = field(default_factory=list)  # fault → next job succeeded
    unrecovered: int = 0  # faults after which no job succeeded within the bound
    violations: list[Violation] = field(default_factory=list)  # the checker's findings
    duration_s: float = 0.0  # wall time of the scenario, checker included

    def count(self, *kinds: str) -> int:
        return sum(1 for v in self.violations if v.kind in kinds)

    def summary(self) -> str:
        rec = sorted(self.recoveries_s)
        p50 = f"{statistics.median(rec):.1f}" if rec else "-"
        p99 = f"{rec[min(len(rec) - 1, int(0.99 * len(rec)))]:.1f}" if rec else "-"
        by_inv = Counter(v.invariant for v in self.violations)
        return (
            f"{self.scenario}: {self.admitted} jobs admitted ({sum(self.refused.values())} "
            f"refused {dict(self.refused)}), {self.faults} faults, final {dict(self.statuses)}; "
            f"lost {self.count('lost')}, duplicated results {self.count('duplicate_result')}, "
            f"duplicated billing {self.count('duplicate_billing')}; recovery p50 {p50} s, "
            f"p99 {p99} s {[round(r, 1) for r in rec]} (unrecovered {self.unrecovered}); "
            f"violations {dict(by_inv) or 0}; "
            f"{self.duration_s:.0f} s"
        )


# Filled by the scenarios, printed by conftest's pytest_terminal_summary.
RUNS: list[FaultRun] = []

# A fault whose next successful job takes longer than this counts as unrecovered.
RECOVERY_BOUND_S = 180.0


def run_scenario(
    name: str,
    platform: dict[str, Any],
    model: Path | str,
    sizes: Sizes,
    faults: int,
    inject: Callable[[Ledger, str], datetime | None],
    receiver_plan: Plan | None = None,
    receiver_host: str = "127.0.0.1",
    fault_jobs: Callable[[], Sequence[str]] = tuple,
    **spec: Any,
) -> FaultRun:
    """Deploy `model` (a directory, or a URI the platform reads) as `faults-<name>` (`spec`:
    more deployment fields, e.g. min_workers; `receiver_plan`: how the webhook receiver
    misbehaves, see receiver.py), warm one worker, submit `sizes.jobs` async jobs (each with a
    webhook to a local receiver) and call `inject(ledger, deployment)` `faults` times, spread
    evenly over the jobs' completions; then run the checker over everything.

    `inject` does one fault and returns when it happened (None: it found nothing to break;
    the run then injects fewer). Recovery is measured from that instant to the next job of
    the deployment that succeeded.

    `platform["urls"]`, when there, are several API hosts: the jobs go through each in turn;
    `receiver_host` is where they reach the webhook receiver. `fault_jobs()` are jobs the
    faults submitted themselves (one to find in flight): checked like the others, webhooks
    aside.
    """
    started = time.monotonic()
    deployment = f"faults-{name.replace('_', '-')}"
    client = Client(base_url=platform["url"], api_key=platform["api_key"], timeout=30)
    others = [
        Client(base_url=url, api_key=platform["api_key"], timeout=30)
        for url in platform.get("urls", [platform["url"]])[1:]
    ]
    ledger = Ledger(platform["database_url"])
    run = FaultRun(name)
    try:
        client.deployments.create(
            name=deployment, model=str(model), **{"scaledown_window_s": 600, **spec}
        )
        # the first worker's cold start is no fault's recovery
        warm = client.submit(deployment, input={"prompt": "warm", "max_tokens": 1})
        assert wait_finished(ledger, deployment, 1, RECOVERY_BOUND_S), f"{warm.id} never ran"
        base = ledger.finished(deployment)
        bound_s = sizes.timeout_s()
        with WebhookReceiver(receiver_plan, receiver_host) as rx:
            sub = Submitter(
                [client, *others], ledger, deployment, sizes.jobs, sizes.max_tokens,
                webhook=rx.url,
            )  # fmt: skip
            sub.start()
            for k in range(faults):
                # the k-th fault once this share of the jobs has ended
                share = base + (k + 1) * sizes.jobs // (faults + 1)
                if not wait_finished(ledger, deployment, share, bound_s):
                    break
                fault_at = inject(ledger, deployment)
                if fault_at is None:
                    continue
                run.faults += 1
                recovered = wait_recovered(ledger, deployment, fault_at, RECOVERY_BOUND_S)
                if recovered is None:
                    run.unrecovered += 1
                else:
                    run.recoveries_s.append(recovered)
            sub.join(bound_s)
            assert not sub.is_alive(), "the submitter did not finish"
            if sub.error is not None:
                raise sub.error
            admitted = [*sub.admitted, *fault_jobs()]
            run.admitted, run.refused = len(admitted), sub.refused
            evidence = Evidence(
                database_url=platform["database_url"],
                redis_url=platform["redis_url"],
                admitted=admitted,
                webhooks=WebhookEvidence(rx.log, client.webhooks.secret(), frozenset(sub.admitted)),
            )
            run.violations = check(evidence, Bounds(terminal_s=max(120.0, 2.0 * sizes.jobs)))
        run.statuses = ledger.statuses(admitted)
    finally:
        ledger.close()
        for c in (client, *others):
            c.close()
    run.duration_s = time.monotonic() - started
    RUNS.append(run)
    print(run.summary())
    return run
