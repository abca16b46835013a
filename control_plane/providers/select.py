"""The provider a reconciler process uses, chosen by `Settings.provider`."""

from __future__ import annotations

from collections.abc import Mapping

from control_plane.providers.base import Provider
from control_plane.providers.local import LocalProvider
from control_plane.settings import Settings


def make_provider(settings: Settings, env: Mapping[str, str]) -> Provider:
    """`env`: the workers' environment (`local.worker_env`); the Kubernetes provider puts it in
    each pod's spec, minus the worker token, which pods read from a Secret. Raises ValueError
    naming the setting when the provider cannot work with these settings."""
    if settings.provider == "kubernetes":
        # imported only here: the kubernetes client is an optional extra
        from control_plane.providers.kubernetes import KubernetesProvider

        return KubernetesProvider.from_settings(settings, env)
    return LocalProvider(env, settings.state_dir / "logs" / "workers", settings.worker_python)
