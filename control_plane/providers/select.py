"""The provider a reconciler process uses, chosen by `Settings.provider`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from control_plane.providers.base import Provider
from control_plane.providers.local import LocalProvider, worker_env
from control_plane.providers.logs import LocalLogs, LogSource
from control_plane.settings import Settings


def workers_env(settings: Settings, base: Mapping[str, str]) -> dict[str, str]:
    """The environment every worker starts with, whichever the provider: `base` (this
    process's) as `local.worker_env` filters it, plus where workers reach the control plane
    and Redis (PLATFORM_WORKER_REDIS_URL when their network path differs) and their token."""
    env = worker_env(
        base,
        {
            "PLATFORM_INTERNAL_URL": settings.internal_url,
            "PLATFORM_WORKER_TOKEN": settings.worker_token.get_secret_value(),
            "PLATFORM_REDIS_URL": settings.worker_redis_url or settings.redis_url,
            "PLATFORM_WORKER_THREADS": str(settings.worker_threads),
        },
    )
    env.setdefault("AWS_DEFAULT_REGION", settings.s3_region)
    return env


def make_provider(settings: Settings, env: Mapping[str, str]) -> Provider:
    """`env`: the workers' environment (`local.worker_env`); the Kubernetes provider puts it in
    each pod's spec, minus the worker token, which pods read from a Secret. Raises ValueError
    naming the setting when the provider cannot work with these settings."""
    if settings.provider == "kubernetes":
        # imported only here: the kubernetes client is an optional extra
        from control_plane.providers.kubernetes import KubernetesProvider

        return KubernetesProvider.from_settings(settings, env)
    return LocalProvider(
        env, workers_log_dir(settings), settings.worker_python, settings.vllm_python
    )


def workers_log_dir(settings: Settings) -> Path:
    """Where the local provider writes each worker's output (`<worker id>.log`)."""
    return settings.state_dir / "logs" / "workers"


def make_log_source(settings: Settings) -> LogSource:
    """Where a process other than the reconciler (the API) reads workers' logs: the files the
    local provider writes, or the pods' logs through the Kubernetes API. Nothing is started
    (no watch, no access checks): reading a log is all it does."""
    if settings.provider == "kubernetes":
        from control_plane.providers.kubernetes.pod_logs import PodLogs

        return PodLogs.from_settings(settings)
    return LocalLogs(workers_log_dir(settings))
