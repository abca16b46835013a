"""`python -m worker --worker-id … --model s3://… --deployment-id … --queue …`: one worker
process serving one deployment, or with `--pool` a warm-pool worker that boots and waits for its
assignment (started by a provider)."""

from __future__ import annotations

import argparse
import sys

from common import logs, tracing
from common.protocol import Assignment
from worker.runtime.lifecycle import WorkerRuntime
from worker.settings import WorkerSettings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    p.add_argument("--worker-id", required=True)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--pool", action="store_true", help="boot, then wait for an assignment")
    p.add_argument("--deployment-id")
    p.add_argument("--deployment-version", type=int, default=1)
    p.add_argument("--model", help="model directory URI (s3://, file://, path)")
    p.add_argument("--queue")
    p.add_argument("--max-concurrency", type=int, default=1)
    args = p.parse_args(argv)
    assignment = None
    if not args.pool:
        missing = [
            f"--{n}"
            for n in ("deployment-id", "model", "queue")
            if not getattr(args, n.replace("-", "_"))
        ]
        if missing:
            p.error(f"{', '.join(missing)} required without --pool")
        assignment = Assignment(
            deployment_id=args.deployment_id,
            deployment_version=args.deployment_version,
            model_uri=args.model,
            queue=args.queue,
            max_concurrency=max(1, args.max_concurrency),
        )
    settings = WorkerSettings()
    logs.configure("worker", settings)
    tracing.configure("worker", settings)
    logs.set_process_fields(worker_id=args.worker_id, deployment_id=args.deployment_id)
    if settings.worker_threads > 0:
        import torch

        torch.set_num_threads(settings.worker_threads)
    return WorkerRuntime(settings, args.worker_id, args.accelerator, assignment).run()


if __name__ == "__main__":
    sys.exit(main())
