"""The messages of the wire contract, each with one encoding (`to_json` / `from_json`):

    Assignment   control plane → worker: what it serves. A worker started for a deployment
                 finds it in its environment (ASSIGNMENT_ENV); a warm-pool worker pops it from
                 `protocol.worker_assignment_key`. The same JSON either way.
    Claim        control plane → worker: a job it now holds, as the claim route answers it and
                 as a hand-off at admission pushes it (`protocol.worker_handoffs_key`).

A `from_json` / `from_dict` raises ValueError on anything else, naming what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from common.job_input import JobInput

# The environment variable that carries a directly started worker's `Assignment` (JSON). Its
# storage credentials are in it: a pod gets it from a Secret of its own, never in its spec.
ASSIGNMENT_ENV = "PLATFORM_WORKER_ASSIGNMENT"


@dataclass(frozen=True, slots=True)
class Assignment:
    """What a worker serves. Its storage credentials travel with it (through the worker's
    environment, or through Redis, which already carries every prompt and output: it is
    inside the trust boundary)."""

    deployment_id: str  # deployment served
    deployment_version: int  # spec version served
    model_uri: str  # weights location as read (s3://, file://, hf://), tenancy resolved
    queue: str  # broker queue consumed
    max_concurrency: int  # jobs held at once (requests batched by the engine)
    # The storage credentials of this deployment's tenant for that location, and only those
    # (AWS_*, HF_TOKEN): a worker never holds what its deployment may not read.
    storage_env: dict[str, str] = field(default_factory=dict)
    # The engine that serves it, resolved at deploy time: "builtin" (worker/engine) or "vllm"
    # (worker/vllm, run by the vLLM environment's interpreter).
    engine: str = "builtin"
    # Accelerators the worker holds: vLLM's tensor-parallel size (the built-in engine: 1).
    accelerator_count: int = 1

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Assignment:
        """Raises ValueError on anything but an assignment."""
        try:
            d = json.loads(raw)
            env = d.get("storage_env") or {}
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
                raise ValueError("storage_env: strings only")
            return cls(
                deployment_id=str(d["deployment_id"]),
                deployment_version=int(d["deployment_version"]),
                model_uri=str(d["model_uri"]),
                queue=str(d["queue"]),
                max_concurrency=max(1, int(d["max_concurrency"])),
                storage_env=dict(env),
                engine=_engine(d.get("engine", "builtin")),
                accelerator_count=max(1, int(d.get("accelerator_count", 1))),
            )
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not an assignment: {exc}") from None


@dataclass(frozen=True, slots=True)
class Claim:
    """A job given to a worker as a new attempt (the database already says so)."""

    job_id: str
    attempt: int  # the fence: only this attempt's report may end the job
    input: JobInput  # what to run, every default resolved
    # the execution limit: the job's own, else its deployment's current one
    execution_timeout_s: float
    deployment: str  # the deployment's name (the model, for traces)
    # the job's trace, which the worker's spans join; None: not traced
    traceparent: str | None = None
    # its broker priority (the engine's scheduling class), on a hand-off; None on a claim
    # answer (the worker knows it from the wake-up it claimed)
    priority: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "claimed": True,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "input": self.input.to_dict(),
            "execution_timeout_s": self.execution_timeout_s,
            "traceparent": self.traceparent,
            "deployment": self.deployment,
        }
        if self.priority is not None:
            out["priority"] = self.priority
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Claim:
        """Raises ValueError on anything but a claim (a malformed input names its field)."""
        try:
            priority = d.get("priority")
            traceparent = d.get("traceparent")
            return cls(
                job_id=_str(d["job_id"], "job_id"),
                attempt=_int(d["attempt"], "attempt"),
                input=JobInput.from_dict(d["input"]),
                execution_timeout_s=_number(d["execution_timeout_s"], "execution_timeout_s"),
                deployment=_str(d["deployment"], "deployment"),
                traceparent=None if traceparent is None else _str(traceparent, "traceparent"),
                priority=None if priority is None else _int(priority, "priority"),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a claim: {exc!r}") from None

    @classmethod
    def from_json(cls, raw: str | bytes) -> Claim:
        try:
            d = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a claim: {exc}") from None
        if not isinstance(d, dict):
            raise ValueError("not a claim: expected an object")
        return cls.from_dict(d)


ENGINES = ("builtin", "vllm")


def _engine(value: Any) -> str:
    if value not in ENGINES:
        raise ValueError(f"engine: expected one of {', '.join(ENGINES)}, got {value!r}")
    return str(value)


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}: expected a non-empty string, got {value!r}")
    return value


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    return value


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name}: expected a number > 0, got {value!r}")
    return float(value)
