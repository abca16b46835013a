"""`python -m worker --worker-id … [--accelerator …] [--pool [--engine builtin|vllm]]`: one
worker process, started by a provider. It serves the deployment its environment's assignment
names (PLATFORM_WORKER_ASSIGNMENT: `common.messages.Assignment` as JSON), on the assignment's
engine; with `--pool` it boots, prepares `--engine` (vLLM's imports: run it with the vLLM
environment's python) and waits for a deployment on that engine through Redis."""

from __future__ import annotations

import argparse
import os
import sys

from common import logs, tracing
from common.messages import ASSIGNMENT_ENV, ENGINES, Assignment
from worker.runtime.lifecycle import WorkerRuntime
from worker.settings import WorkerSettings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    p.add_argument("--worker-id", required=True)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--pool", action="store_true", help="boot, then wait for an assignment")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        help="with --pool: the engine to prepare, and the only one served (default builtin); "
        "without it the assignment names the engine",
    )
    args = p.parse_args(argv)
    if args.engine is not None and not args.pool:
        p.error("--engine is for --pool workers: an assigned worker runs its assignment's")
    assignment = None
    if not args.pool:
        raw = os.environ.pop(ASSIGNMENT_ENV, None)  # read once; its credentials go below
        if not raw:
            p.error(f"{ASSIGNMENT_ENV} must hold the worker's assignment without --pool")
        try:
            assignment = Assignment.from_json(raw)
        except ValueError as exc:
            p.error(f"{ASSIGNMENT_ENV}: {exc}")
        # its tenant's storage credentials, for the loader (boto3 and the S3 client)
        os.environ.update(assignment.storage_env)
    settings = WorkerSettings()
    logs.configure("worker", settings)
    tracing.configure("worker", settings)
    logs.set_process_fields(
        worker_id=args.worker_id, deployment_id=assignment.deployment_id if assignment else None
    )
    pool_engine = args.engine or "builtin"
    return WorkerRuntime(settings, args.worker_id, args.accelerator, assignment, pool_engine).run()


if __name__ == "__main__":
    sys.exit(main())
