"""Read-only views over the platform's JSON objects, shared by the sync and async clients.

A view keeps the decoded JSON (`.raw`) and exposes the documented fields as properties, so a
field the server adds later is still reachable through `.raw` without an SDK release.
"""

from __future__ import annotations

from typing import Any

# Job states after which nothing changes any more (docs/api.md).
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "canceled", "expired", "timed_out"})
# Batch states after which nothing changes any more.
BATCH_TERMINAL_STATUSES = frozenset({"completed", "canceled"})
# Worker states in which a worker takes jobs: the deployment's version is ready.
SERVING_WORKER_STATES = frozenset({"idle", "busy"})


class _RawView:
    """A resource as the platform last sent it (`raw`), read through typed properties."""

    __slots__ = ("_raw",)

    def __init__(self, raw: dict[str, Any]) -> None:
        self._raw = raw

    @property
    def raw(self) -> dict[str, Any]:
        """The resource as the platform last sent it."""
        return self._raw

    @property
    def id(self) -> str:
        return str(self._raw.get("id", ""))


class _RunView(_RawView):
    """A job or batch: work sent to a deployment."""

    __slots__ = ()

    @property
    def deployment(self) -> str | None:
        return _opt_str(self._raw.get("deployment"))


class JobView(_RunView):
    """Fields of a `Job` (docs/api.md); `Job` and `AsyncJob` add the I/O methods."""

    __slots__ = ()

    @property
    def status(self) -> str:
        """queued | starting | running | succeeded | failed | canceled | expired | timed_out"""
        return str(self._raw.get("status", ""))

    @property
    def status_reason(self) -> str | None:
        """Why a job is `starting` (no_capacity, loading_weights, ...), when known."""
        return _opt_str(self._raw.get("status_reason"))

    @property
    def output(self) -> dict[str, Any] | None:
        """{"text": ..., "finish_reason": "stop" | "length" | "abort"} once succeeded."""
        return _opt_dict(self._raw.get("output"))

    @property
    def error(self) -> dict[str, Any] | None:
        """{"type": ..., "message": ...} when the job failed."""
        return _opt_dict(self._raw.get("error"))

    @property
    def usage(self) -> dict[str, Any] | None:
        """Token counts and seconds spent queued / executing."""
        return _opt_dict(self._raw.get("usage"))

    @property
    def attempt(self) -> int:
        value = self._raw.get("attempt")
        return value if isinstance(value, int) else 0

    @property
    def webhook_status(self) -> str | None:
        """none | pending | delivered | failed"""
        return _opt_str(self._raw.get("webhook_status"))

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def text(self) -> str | None:
        """The generated text, once the job succeeded."""
        output = self.output
        return _opt_str(output.get("text")) if output else None

    def __repr__(self) -> str:
        # NOTE: never the input or output: they hold prompts and generations (STYLE 15).
        return f"{type(self).__name__}(id={self.id!r}, status={self.status!r})"


# The fields of a DeploymentSpec (docs/api.md); the rest of a Deployment is server-made.
SPEC_FIELDS = (
    "name",
    "model",
    "accelerator",
    "accelerator_count",
    "engine",
    "min_workers",
    "max_workers",
    "target_concurrency",
    "scaledown_window_s",
    "max_boot_s",
    "cold_penalty_s",
    "queue_wait_s",
    "execution_timeout_s",
    "defaults",
    "tool_parser",
)


class Deployment:
    """A deployment as the platform describes it: its spec, version, live workers and the
    autoscaler's latest decision.

    Example:
        dep = client.deployments.get("demo")
        print(dep.version, dep.workers)      # 3 {"idle": 1}
        print(dep.scaling["reason"])         # keepalive
        client.deployments.update("demo", {**dep.spec, "max_workers": 2})
    """

    __slots__ = ("_raw",)

    def __init__(self, raw: dict[str, Any]) -> None:
        self._raw = raw

    @property
    def raw(self) -> dict[str, Any]:
        return self._raw

    @property
    def name(self) -> str:
        return str(self._raw.get("name", ""))

    @property
    def id(self) -> str | None:
        return _opt_str(self._raw.get("id"))

    @property
    def model(self) -> str | None:
        return _opt_str(self._raw.get("model"))

    @property
    def accelerator(self) -> str | None:
        return _opt_str(self._raw.get("accelerator"))

    @property
    def version(self) -> int:
        value = self._raw.get("version")
        return value if isinstance(value, int) else 0

    @property
    def engine(self) -> str | None:
        """The engine asked for: auto | builtin | vllm."""
        return _opt_str(self._raw.get("engine"))

    @property
    def engine_resolved(self) -> str | None:
        """The engine that serves it (builtin | vllm), chosen at deploy time."""
        return _opt_str(self._raw.get("engine_resolved"))

    @property
    def engine_reason(self) -> str | None:
        """Why that engine, for people (not parsed)."""
        return _opt_str(self._raw.get("engine_reason"))

    @property
    def workers(self) -> dict[str, int]:
        """Live workers by state, e.g. {"idle": 1, "busy": 2}."""
        return _int_map(self._raw.get("workers"))

    @property
    def scaling(self) -> dict[str, Any] | None:
        """The autoscaler's latest decision (docs/api.md), e.g. {"desired": 1, "actual": 1,
        "reason": "keepalive", "next_prewarm_at": None, ...}; None when there is none."""
        return _opt_dict(self._raw.get("scaling"))

    @property
    def spec(self) -> dict[str, Any]:
        """Only the DeploymentSpec fields: what `deployments.update` takes back."""
        return {k: self._raw[k] for k in SPEC_FIELDS if k in self._raw}

    def __repr__(self) -> str:
        return f"Deployment(name={self.name!r}, version={self.version})"


class BatchView(_RunView):
    """Fields of a `Batch` (docs/api.md); `Batch` and `AsyncBatch` add the I/O methods."""

    __slots__ = ()

    @property
    def status(self) -> str:
        """running | completed | canceled"""
        return str(self._raw.get("status", ""))

    @property
    def total(self) -> int:
        """How many jobs (input lines) the batch has."""
        value = self._raw.get("total")
        return value if isinstance(value, int) else 0

    @property
    def counts(self) -> dict[str, int]:
        """Its jobs by status, e.g. {"queued": 3, "running": 1, "succeeded": 6, ...}."""
        return _int_map(self._raw.get("counts"))

    @property
    def finished(self) -> int:
        """Jobs that reached a final status (succeeded or not)."""
        return sum(n for status, n in self.counts.items() if status in TERMINAL_STATUSES)

    @property
    def results_uri(self) -> str | None:
        """Where the results JSONL is stored, once the batch completed."""
        return _opt_str(self._raw.get("results_uri"))

    @property
    def webhook_status(self) -> str | None:
        """none | pending | delivered | failed"""
        return _opt_str(self._raw.get("webhook_status"))

    @property
    def is_terminal(self) -> bool:
        return self.status in BATCH_TERMINAL_STATUSES

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.id!r}, status={self.status!r}, "
            f"finished={self.finished}/{self.total})"
        )


class ApiKey(_RawView):
    """An API key of this tenant. `key`, the secret, is only known right after `keys.create`;
    `raw` then holds it under "key" too.

    Example:
        key = client.keys.create(name="ci", scopes=["run", "read"])
        print(key.id, key.key)        # store key.key now: the platform keeps only its hash
    """

    __slots__ = ()

    @property
    def name(self) -> str:
        return str(self._raw.get("name") or "")

    @property
    def prefix(self) -> str | None:
        """The public part of the key ("pk_ab12cd"), safe to show and log."""
        return _opt_str(self._raw.get("prefix"))

    @property
    def scopes(self) -> list[str]:
        scopes = self._raw.get("scopes")
        return [str(s) for s in scopes] if isinstance(scopes, list) else []

    @property
    def key(self) -> str | None:
        """The full secret key: only in the answer to `keys.create`."""
        return _opt_str(self._raw.get("key"))

    @property
    def revoked(self) -> bool:
        return self._raw.get("revoked_at") is not None

    def __repr__(self) -> str:
        # NOTE: never the secret.
        return f"ApiKey(id={self.id!r}, prefix={self.prefix!r}, scopes={self.scopes!r})"


class StoredFile(_RawView):
    """A file of the tenant's namespace (`store://path`).

    Example:
        f = client.files.upload("in/prompts.jsonl", "./prompts.jsonl")
        client.batches.create(f.uri, deployment="demo")
    """

    __slots__ = ()

    @property
    def path(self) -> str:
        return str(self._raw.get("path", ""))

    @property
    def uri(self) -> str:
        """What to name it by: "store://<path>"."""
        return str(self._raw.get("uri", ""))

    @property
    def bytes(self) -> int:
        size = self._raw.get("bytes")
        return size if isinstance(size, int) else 0

    @property
    def etag(self) -> str | None:
        return _opt_str(self._raw.get("etag"))

    def __repr__(self) -> str:
        return f"StoredFile(uri={self.uri!r}, bytes={self.bytes})"


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _opt_dict(value: object) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _int_map(value: Any) -> dict[str, int]:
    """A JSON object of counts as {str: int}; anything else (missing, malformed) as {}."""
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, int)}
