"""`python -m worker --worker-id … --model s3://…`: one worker process (started by a provider)."""

from __future__ import annotations

import argparse
import logging
import sys

from worker.runtime.lifecycle import WorkerIdentity, WorkerRuntime
from worker.settings import WorkerSettings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    p.add_argument("--worker-id", required=True)
    p.add_argument("--deployment-id", required=True)
    p.add_argument("--deployment-version", type=int, default=1)
    p.add_argument("--model", required=True, help="model directory URI (s3://, file://, path)")
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--queue", required=True)
    p.add_argument("--max-concurrency", type=int, default=1)
    args = p.parse_args(argv)
    settings = WorkerSettings()
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s worker {args.worker_id} %(name)s: %(message)s",
    )
    if settings.worker_threads > 0:
        import torch

        torch.set_num_threads(settings.worker_threads)
    identity = WorkerIdentity(
        worker_id=args.worker_id,
        deployment_id=args.deployment_id,
        deployment_version=args.deployment_version,
        model_uri=args.model,
        accelerator=args.accelerator,
        queue=args.queue,
        max_concurrency=max(1, args.max_concurrency),
    )
    return WorkerRuntime(settings, identity).run()


if __name__ == "__main__":
    sys.exit(main())
