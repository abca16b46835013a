"""Settings of control-plane processes (env prefix `PLATFORM_`), built once at the entry point.

Every variable is documented in docs/configuration.md. The object is frozen: derived runtime
values live elsewhere, never patched in here.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from common.logs import LogSettings
from common.tracing import TraceSettings
from control_plane.domain.scaling.decide import MAX_TICK_S

# Default price per second of worker time, per accelerator type (USD). Overridable with
# PLATFORM_RATES_PER_S='{"cpu": "0.00002", "h100": "0.0011"}'.
DEFAULT_RATES_PER_S: dict[str, Decimal] = {
    "cpu": Decimal("0.000020"),
    "a10g": Decimal("0.000306"),
    "l4": Decimal("0.000222"),
    "a100": Decimal("0.000694"),
    "h100": Decimal("0.001097"),
    "h200": Decimal("0.001250"),
}


# PLATFORM_API_PROCESSES at most (the embedded supervisor checks it before it starts anything).
MAX_API_PROCESSES = 64
# PLATFORM_RECONCILERS at most: one leads, the others only wait for its lease to run out.
MAX_RECONCILERS = 8


class Settings(LogSettings, TraceSettings):
    """Configuration of one control-plane process.

    Example: `Settings(database_url="sqlite:///x.db", worker_token="...")`, or from the
    environment: `PLATFORM_DATABASE_URL=postgresql+psycopg://... python -m control_plane.api`.
    """

    model_config = SettingsConfigDict(env_prefix="PLATFORM_", frozen=True, extra="ignore")

    database_url: str = "sqlite:///platform.db"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # None means AWS itself; the embedded default points this at `rclone serve s3`.
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    # How workers reach Redis and the platform's S3 endpoint when their network path differs
    # from the control plane's (a node-local address or proxy in a cluster); empty: the same
    # redis_url / s3_endpoint_url as the control plane. The S3 one applies to every model read
    # from that endpoint (the platform's store, and tenants' buckets registered on it).
    worker_redis_url: str = ""
    worker_s3_endpoint_url: str = ""

    api_host: str = "127.0.0.1"
    api_port: int = 8000
    # API processes serving api_port. Above 1, each binds with SO_REUSEPORT and the kernel
    # spreads connections among them; the embedded supervisor starts this many.
    api_processes: int = Field(1, ge=1, le=MAX_API_PROCESSES)
    # The reconciler's and the Celery worker's own /metrics (their event families, as
    # control_plane/metrics/server.py serves them), for hosts where no API process sums them
    # (a pod each, a container each). None: not served.
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(None, ge=0, le=65535)
    # URL at which workers reach the control plane's internal endpoints.
    internal_url: str = "http://127.0.0.1:8000"
    # Shared secret of workers for /internal endpoints.
    worker_token: SecretStr = SecretStr("")

    state_dir: Path = Path(".state")

    # A call admitted while one of its deployment's workers has a free slot (and nothing of
    # that deployment waits) is claimed for that worker in the admission's own transaction and
    # handed to it through Redis: no claim request (services/jobs/handoff.py). Off: every job waits
    # for a worker's claim.
    job_handoffs: bool = True

    sync_wait_default_s: float = Field(60.0, gt=0)
    sync_wait_max_s: float = Field(300.0, gt=0)
    max_request_bytes: int = Field(1_000_000, gt=0)
    # A request's head: its header fields at most this many bytes in all (names, values) and
    # this many fields; past either, 431 before any route runs (api/header_limit.py), and the
    # API's server stops reading a head past the byte limit (api/server.py). 64 KiB is AWS
    # load balancers' bound, 100 fields Apache's and http.client's; API clients send ~10.
    max_header_bytes: int = Field(65_536, ge=8_192)
    max_header_count: int = Field(100, ge=32)

    # Webhook targets on private/loopback/link-local addresses are refused unless allowed.
    webhook_allow_private: bool = False
    # Delay before each retry of a failed delivery (seconds); jitter is added on top.
    webhook_retry_schedule_s: tuple[float, ...] = (5, 30, 120, 600, 1800, 3600, 7200, 14400)
    webhook_timeout_s: float = Field(10.0, gt=0)

    # The reconciler's tick. At most 2 s: the autoscaler's panic window is 6 s of samples, and
    # its pre-warms start one such tick early (`scaling.decide.MAX_TICK_S`).
    autoscaler_interval_s: float = Field(0.5, gt=0, le=MAX_TICK_S)
    # Each deployment's autoscaling models are refit this often, off the tick, by the
    # reconciler's background thread (reconcile/refresh.py).
    autoscaler_refit_interval_s: float = Field(5.0, gt=0, le=60.0)
    # Where workers run: `local` (child processes of the reconciler, one per accelerator) or
    # `kubernetes` (one pod per worker: control_plane/providers/kubernetes/).
    provider: Literal["local", "kubernetes"] = "local"
    # Python interpreter used for local worker processes.
    worker_python: str = ""
    # Python of the vLLM environment (a virtualenv with vLLM and this project installed): local
    # workers of deployments whose engine resolved to vllm run `-m worker` with it, and so do
    # the warm pool's vLLM workers (`--pool --engine vllm`). Empty: this
    # platform has no vLLM (engine vllm is refused, auto never picks it). The embedded
    # `platform up` takes the repository's .venv-vllm/bin/python when this is not set at all.
    vllm_python: str = ""
    # Torch intra-op threads per local worker (0: torch's default).
    worker_threads: int = Field(1, ge=0)
    # Warm pool (docs/architecture.md): generic workers booted ahead, a pool per accelerator
    # type and engine, at most this many in all; 0: none (the embedded `platform up`
    # defaults to 1).
    warm_pool_max: int = Field(0, ge=0)
    # Accelerators of each type this platform has (the local provider: this host's GPUs); the
    # warm pool never holds more than the ones deployments' workers leave free. A type not
    # listed (the CPU): no limit. Once set, deployments may ask only for `cpu` or a listed
    # type (offered_accelerators).
    accelerators: dict[str, int] = Field(default_factory=dict)

    # Per-tenant defaults (a tenant's own values override them).
    default_requests_per_min: int = Field(600, ge=1)
    default_tokens_per_min: int = Field(2_000_000, ge=1)
    default_max_in_flight: int = Field(1_000, ge=1)
    # Redis unavailable during a quota check: admit (open) or answer 503 (closed).
    quota_fail_open: bool = True

    rates_per_s: dict[str, Decimal] = Field(default_factory=lambda: dict(DEFAULT_RATES_PER_S))

    # log_level, log_levels, log_format: from LogSettings (common/logs.py), like the worker's;
    # otel_exporter: from TraceSettings (common/tracing.py).

    # --- batches and webhooks ---
    # Bucket that receives batch results (`batches/<tenant>/<batch>.jsonl`); created if missing.
    results_bucket: str = "platform-results"
    # A batch holds at most this many input lines.
    batch_max_lines: int = Field(10_000, ge=1)
    # Upper bound of a batch's `max_in_flight` (jobs of one batch dispatched at once).
    batch_max_in_flight: int = Field(64, ge=1)
    # Largest `input_uri` object a batch may read (bytes).
    batch_max_input_bytes: int = Field(50_000_000, gt=0)
    # `job.output` webhooks of one job are sent at most this often (seconds).
    webhook_output_interval_s: float = Field(2.0, gt=0)
    # After a rotation the previous secret keeps signing for this long (seconds).
    webhook_rotation_overlap_s: float = Field(24 * 3600.0, ge=0)

    # --- tenant-scoped storage (docs/security.md) ---
    # Bucket of the platform's store: a tenant's `store://path` is `tenants/<id>/path` there.
    store_bucket: str = "platform-store"
    # Buckets of the platform besides the store and results buckets (the embedded S3 server's
    # own: `platform up` sets them); no tenant may register credentials for any of them.
    reserved_buckets: tuple[str, ...] = ()
    # Largest file one `PUT /v1/files/{path}` accepts (bytes).
    upload_max_bytes: int = Field(200 * 2**30, gt=0)
    # Encrypts the storage credentials tenants register; without it they cannot register any.
    secret_key: SecretStr = SecretStr("")
    # S3 endpoints tenants may register credentials for, besides the platform's own (and AWS
    # when that is unset). Anything else would let a tenant aim the platform at any URL.
    storage_endpoints: tuple[str, ...] = ()
    # `file://` and host paths for the operator's tenant; never for other tenants.
    allow_host_paths: bool = False
    # Check a deployment's model before creating it or changing it (config.json, weights,
    # safetensors headers: services/models/model_check.py); off, a bad model fails in its workers.
    validate_models: bool = True

    # --- several control-plane replicas (docs/operations.md) ---
    # The reconciler acts only while it holds the lease (a Kubernetes Lease under the
    # kubernetes provider, a Redis key otherwise). A leader that stops renewing it is replaced
    # after this long; each tick renews it, so it must be well above autoscaler_interval_s.
    reconciler_lease_s: float = Field(10.0, ge=3.0, le=60.0)
    # Reconciler processes the embedded `platform up` starts (one leads; a second one takes
    # over within reconciler_lease_s when the leader dies). A cluster sets its replicas instead.
    reconcilers: int = Field(1, ge=1, le=MAX_RECONCILERS)
    # This replica's name in the lease (the pod's name under Kubernetes); default: host:pid.
    replica_id: str = ""

    # --- Kubernetes provider (control_plane/providers/kubernetes/) ---
    # Namespace of the worker pods, their Secrets, the worker-token Secret and the Lease.
    kubernetes_namespace: str = "default"
    # Kubeconfig file of the control plane's identity; empty: the pod's own service account
    # (in-cluster), the normal case when the control plane runs in the cluster.
    kubernetes_kubeconfig: str = ""
    # Worker image (required with the kubernetes provider): its `python` runs `-m worker`.
    kubernetes_worker_image: str = ""
    # Worker image of deployments whose engine resolved to vllm (and of the warm pool's vLLM
    # workers): its `python` has vLLM and this project, and runs `-m worker`. Empty: no vLLM
    # on Kubernetes (as PLATFORM_VLLM_PYTHON).
    kubernetes_vllm_image: str = ""
    kubernetes_image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    # Service account of worker pods; empty: the namespace's default. Its API token is never
    # mounted: workers do not talk to the Kubernetes API.
    kubernetes_service_account: str = ""
    # Secret (and its key) holding PLATFORM_WORKER_TOKEN: pods read it by secretKeyRef, so the
    # token never appears in a pod spec.
    kubernetes_worker_token_secret: str = "platform-worker-token"
    kubernetes_worker_token_secret_key: str = "token"
    # Node labels of each accelerator type's nodes, e.g. {"h100": {"nvidia.com/gpu.product":
    # "NVIDIA-H100-80GB-HBM3"}}: every GPU type of PLATFORM_ACCELERATORS needs one, or its
    # workers could land on any GPU (and be billed at the wrong rate). `cpu`: any node.
    kubernetes_node_selectors: dict[str, dict[str, str]] = Field(default_factory=dict)
    # Tolerations of each accelerator type's pods, as in a pod spec (GPU nodes are usually
    # tainted): {"h100": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}.
    kubernetes_tolerations: dict[str, list[dict[str, str | int]]] = Field(default_factory=dict)
    # Requests and limits of each accelerator type's worker container: {"h100": {"requests":
    # {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "200Gi"}}}; a GPU type gets one
    # kubernetes_gpu_resource on top unless given. A type not listed: none but its GPU.
    kubernetes_worker_resources: dict[str, dict[str, dict[str, str | int]]] = Field(
        default_factory=dict
    )
    # The extended resource of one GPU (one worker per GPU) for every type but `cpu`.
    kubernetes_gpu_resource: str = "nvidia.com/gpu"
    # terminationGracePeriodSeconds of worker pods: a stopped worker drains (finishes the jobs
    # it holds, 600 s each at most by default, then its cache-tier fill) before the kubelet
    # kills it, so it must cover the longest execution limit of the deployments.
    kubernetes_drain_grace_s: float = Field(900.0, ge=1.0)
    # Port of each worker's /metrics, on its pod IP.
    kubernetes_worker_metrics_port: int = Field(9400, ge=1, le=65535)
    # A worker pod no node can take fails after this long (unschedulable: the scheduler's
    # message), counted toward crash-loop fail-fast; long enough for a cluster autoscaler to
    # add a node. An image that cannot be pulled fails at once.
    kubernetes_unschedulable_grace_s: float = Field(180.0, ge=0.0)
    # app.kubernetes.io/instance of this platform's worker pods: platforms sharing a namespace
    # see only their own pods.
    kubernetes_instance: str = "platform"
    # Node directories behind the workers' weight cache tiers (hostPath volumes), so a tier
    # outlives the pod and the next worker on that node loads from it. Each must exist and be
    # writable by the worker image's user. The disk tier's is mounted at
    # PLATFORM_LOADER_CACHE_DIR, the host-memory tier's (a tmpfs, e.g.
    # /dev/shm/platform-weights) at PLATFORM_LOADER_HOST_CACHE_DIR when
    # PLATFORM_LOADER_HOST_CACHE_BYTES > 0. Empty: an emptyDir (memory-backed for the memory
    # tier), which lasts one pod; no volume at all for a tier that is off.
    kubernetes_disk_cache_host_path: str = ""
    # A PersistentVolumeClaim behind the disk cache tier instead (ReadWriteMany when worker
    # pods run on several nodes): one cache every worker fills and reads. "" = none.
    kubernetes_disk_cache_claim: str = ""
    kubernetes_memory_cache_host_path: str = ""

    @field_validator("worker_token")
    @classmethod
    def _token_not_trivial(cls, v: SecretStr) -> SecretStr:
        secret = v.get_secret_value()
        if secret and len(secret) < 16:
            raise ValueError("PLATFORM_WORKER_TOKEN must be at least 16 characters")
        return v

    def has_vllm(self) -> bool:
        """Whether this platform can start vLLM workers (the engine choice's input): with the
        kubernetes provider its vLLM image, else a vLLM environment's python."""
        if self.provider == "kubernetes":
            return bool(self.kubernetes_vllm_image)
        return bool(self.vllm_python)

    def offered_accelerators(self) -> list[str]:
        """The accelerator types a deployment may ask for: priced, and, once this platform
        lists what it has (PLATFORM_ACCELERATORS), the CPU or a listed type. A GPU type that
        is not listed has no node selector or device to go to."""
        return sorted(
            a
            for a in self.rates_per_s
            if a == "cpu" or not self.accelerators or a in self.accelerators
        )

    def rate_per_s(self, accelerator: str) -> Decimal:
        """Price of one second of a worker with this accelerator."""
        try:
            return self.rates_per_s[accelerator]
        except KeyError:
            raise ValueError(f"no rate configured for accelerator {accelerator!r}") from None
