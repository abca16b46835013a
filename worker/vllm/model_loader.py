"""vLLM's weights through the platform's loader: `load_format="platform"`.

vLLM builds the model from the local directory of small files (model_files.py), then asks
its model loader for the weights. This one streams them with `loader.load` from the
deployment's URI, with the deploying tenant's credentials (the worker's environment) and
through the same cache tiers (host memory, disk) as the built-in engine: no second download
path. Each tensor goes to the model's own `load_weights` (vLLM's name mapping, fusing and
sharding) as soon as the loader has it.

vLLM passes only `model_loader_extra_config` (JSON) to the loader, and with tensor
parallelism it runs in each rank's process (registered there as a vLLM plugin: `register`).
So the extra config names the URI and a key; in the worker's own process the key finds the
progress callback and receives the loader's metrics and tier fill (`PendingLoad`), and in a
rank's child process the loader's options come from the same environment (WorkerSettings).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

if TYPE_CHECKING:
    import torch
    from torch import nn
    from vllm.config import ModelConfig

    from loader import LoadMetrics, LoadOptions, Progress, TierFill

log = logging.getLogger(__name__)

LOAD_FORMAT = "platform"
# Tensors the loader may have finished ahead of `load_weights` (each is in host memory until
# copied into the model): bounds the extra memory of a load to a few tensors.
QUEUE_TENSORS = 8


@dataclass(slots=True)
class PendingLoad:
    """A load the worker's process asked for, and what it did (filled in by the loader)."""

    options: LoadOptions
    on_progress: Callable[[Progress], None] | None = None
    metrics: LoadMetrics | None = None
    tier_fill: TierFill | None = None
    # tensors handed to the model, and the wall time of the whole load into it
    tensors: int = 0
    seconds: float = 0.0


_PENDING: dict[str, PendingLoad] = {}
_PENDING_LOCK = threading.Lock()


def expect_load(key: str, pending: PendingLoad) -> None:
    """Register the worker's own load under `key` (the extra config's "key")."""
    with _PENDING_LOCK:
        _PENDING[key] = pending


def take_load(key: str) -> PendingLoad | None:
    with _PENDING_LOCK:
        return _PENDING.pop(key, None)


def _pending(key: str) -> PendingLoad | None:
    with _PENDING_LOCK:
        return _PENDING.get(key)


@register_model_loader(LOAD_FORMAT)
class PlatformModelLoader(BaseModelLoader):  # type: ignore[misc]
    """Weights from `model_loader_extra_config["uri"]` through `loader.load`."""

    def download_model(self, model_config: ModelConfig) -> None:
        """Nothing ahead: the weights stream during `load_weights`."""

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        extra: dict[str, Any] = dict(self.load_config.model_loader_extra_config or {})
        uri, key = str(extra["uri"]), str(extra.get("key", ""))
        pending = _pending(key)
        if pending is None:  # a tensor-parallel rank's own process
            from worker.settings import WorkerSettings

            pending = PendingLoad(WorkerSettings().load_options())
        t0 = time.monotonic()
        loaded: set[str] | None = model.load_weights(_stream(uri, pending))  # type: ignore[operator]
        pending.seconds = time.monotonic() - t0
        missing = _missing(model, loaded)
        if missing:
            raise ValueError(
                f"{uri}: the checkpoint lacks weights the model needs: {', '.join(missing[:5])}"
                + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            )


def register() -> None:
    """vLLM's plugin entry point (pyproject.toml, `vllm.general_plugins`): importing this
    module registered the loader; vLLM calls this in each of its processes."""


def _stream(uri: str, pending: PendingLoad) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors as the loader completes them (its own thread), in host
    memory; the loader's error, if any, is raised here after the tensors before it."""
    from loader import load

    items: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=QUEUE_TENSORS)
    done = object()

    def run() -> None:
        try:
            result = load(
                uri,
                device="cpu",
                options=pending.options,
                on_tensor=lambda name, tensor: items.put((name, tensor)),
                on_progress=pending.on_progress,
            )
            # the tensors are the model's now: keep only what the load did
            pending.metrics, pending.tier_fill = result.metrics, result.fill
            del result
            items.put(("", done))
        except BaseException as exc:  # raised in the consuming thread
            items.put(("", exc))

    thread = threading.Thread(target=run, name="vllm-weights", daemon=True)
    thread.start()
    try:
        while True:
            name, item = items.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            pending.tensors += 1
            yield name, item
    finally:
        # NOTE: a consumer that stops early (vLLM raising on a tensor) leaves the loader
        # blocked on a full queue; drain it so its thread ends and frees what it holds
        while thread.is_alive():
            try:
                items.get(timeout=0.1)
            except queue.Empty:
                continue


def _missing(model: nn.Module, loaded: set[str] | None) -> list[str]:
    """Parameters `load_weights` did not report loaded (None: the model does not say)."""
    if loaded is None:
        return []
    return sorted(name for name, _ in model.named_parameters() if name not in loaded)
