"""A deployment's spec as a typed object: parsed once where it is read, defaults in one place.

The API validates a spec with its pydantic shape (`api/schemas.py::DeploymentSpec`, whose
defaults come from here) and stores it as a JSON document; everything inside the control plane
reads `Deployment.spec`, which is this object. Nobody restates a default at a call site.

    spec = Spec.from_doc({"name": "demo", "model": "s3://models/demo/"})
    spec.max_boot_s            # 600.0
    spec.scaling_policy()      # ScalingPolicy(min_workers=0, max_workers=1, ...)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from control_plane.domain.scaling.policy import ScalingPolicy

_POLICY = ScalingPolicy()  # the autoscaler's defaults


@dataclass(frozen=True, slots=True)
class Spec:
    name: str  # deployment name (unique per tenant among live deployments)
    model: str  # weights: store://prefix/, s3://bucket/prefix/, hf://org/repo[@rev], file:///path
    accelerator: str = "cpu"  # hardware kind; a key of settings.rates_per_s
    accelerator_count: int = 1  # accelerators per worker (above 1: vLLM's tensor parallelism)
    # The engine asked for: auto | builtin | vllm (domain/engine_choice.py). The one it
    # resolved to, and why, are the deployment row's (`engine_resolved`, `engine_reason`).
    engine: str = "auto"
    min_workers: int = 0  # floor kept without traffic (0 = scale to zero)
    max_workers: int = 1  # ceiling
    target_concurrency: int = 1  # jobs one worker holds at once
    scaledown_window_s: float = 60.0  # longest an unneeded worker is kept warm (seconds)
    max_boot_s: float = 600.0  # boot + load + warm longer than this fails the worker
    # The price, in worker-seconds, the owner puts on one caller waiting through a cold start
    # (on top of the boot itself): the autoscaler keeps or pre-warms a worker when that costs
    # less idle time than the cold starts it spares. Higher: warmer. Its default is the
    # autoscaler's own (domain/scaling/policy.py), so the simulator and the platform agree.
    cold_penalty_s: float = _POLICY.cold_penalty_s
    # How long a job may wait for a slot of a busy worker that is already ready, instead of a
    # new worker being started for it (seconds). Higher: fewer workers, longer waits at spikes;
    # 0 turns it off (a worker for every job that waits). The autoscaler's default too.
    queue_wait_s: float = _POLICY.queue_wait_s
    execution_timeout_s: float = 600.0  # a job's limit unless the job sets its own
    # How tool calls are read from the model's text (`api/tool_calls.py`): auto (from its
    # chat template), hermes or llama3_json.
    tool_parser: str = "auto"
    # Sampling defaults of the deployment (`api.schemas.SamplingDefaults`); None = unset.
    defaults: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Spec:
        """The stored JSON document as a Spec; missing keys take the defaults above."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in doc.items() if k in known and v is not None}
        spec = cls(**values)
        # Coerce: documents written by older versions may hold ints where floats belong.
        return dataclasses.replace(
            spec,
            accelerator_count=int(spec.accelerator_count),
            min_workers=int(spec.min_workers),
            max_workers=int(spec.max_workers),
            target_concurrency=int(spec.target_concurrency),
            scaledown_window_s=float(spec.scaledown_window_s),
            max_boot_s=float(spec.max_boot_s),
            cold_penalty_s=float(spec.cold_penalty_s),
            queue_wait_s=float(spec.queue_wait_s),
            execution_timeout_s=float(spec.execution_timeout_s),
            defaults=dict(spec.defaults or {}),
        )

    def execution_limit_s(self, job_limit_s: float | None) -> float:
        """A job's execution limit: its own when it set one, else the deployment's."""
        return float(job_limit_s) if job_limit_s else self.execution_timeout_s

    def scaling_policy(self) -> ScalingPolicy:
        return ScalingPolicy(
            min_workers=self.min_workers,
            max_workers=self.max_workers,
            target_concurrency=self.target_concurrency,
            scaledown_window_s=self.scaledown_window_s,
            max_boot_s=self.max_boot_s,
            cold_penalty_s=self.cold_penalty_s,
            queue_wait_s=self.queue_wait_s,
        )


def default_of(name: str) -> Any:
    """The default of one Spec field (for the pydantic shape at the edge)."""
    for f in dataclasses.fields(Spec):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            break
    raise KeyError(f"Spec.{name} has no plain default")
