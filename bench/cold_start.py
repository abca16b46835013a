"""Cold start on the embedded platform: a request at zero workers, timed to its first token and
broken into the phases it waited through, next to the loader alone streaming the same weights.

    .venv/bin/python bench/cold_start.py                  # 3 rounds, demo + 1.16 GB model
    .venv/bin/python bench/cold_start.py --skip-big --rounds 1     # demo model only
    .venv/bin/python bench/cold_start.py --scenarios warm_pool,host_tier   # (b) and (c) only
    .venv/bin/python bench/cold_start.py --model-dir /tmp/cs-models   # keep (and reuse) models

Scenarios (rows; bench/coldstart/scenarios.py), each a fresh deployment (min 0, max 1, cpu)
per round, deleted after its request and drained before the next round (the next request
meets zero workers of a deployment with no arrival history, so no keep-alive or pre-warm can
hide the boot). The workers have both weight-cache tiers (`--tiers`, default host,disk: a
host-memory tier on /dev/shm in front of the local disk tier, as DESIGN §3 has them); a worker
fills the tiers its load missed once it is ready, the bench waits for that fill after each
request (the deployment keeps its idle worker meanwhile: a drain cancels a fill), and each
scenario empties the tiers faster than the one it measures:
- (a) no pool: a new worker process boots (`platform up` with PLATFORM_WARM_POOL_MAX=0);
  weights from object storage (tiers emptied); then with a disk-cache hit (host tier emptied)
  and a host-memory hit (after the disk round refilled host memory);
- (b) warm pool, object storage: `platform up` with PLATFORM_WARM_POOL_MAX=1; an idle pool
  worker (`python -m worker --pool`) waits, tiers emptied; the cold start takes it;
- (c) warm pool, host-memory hit: the same, the host tier holding the model (from (b)'s
  fill), the disk tier emptied.
Each group runs on its own `platform up` (with and without a pool), one after the other.

Models (bench/coldstart/models.py): the demo model (`platform models create-demo`) and a
1.16 GB bf16 Llama-shaped checkpoint (`bench/loader.py`'s "small" shape) with the demo's
tokenizer, its lm_head rewritten so that the first token is a visible one; with vLLM's
environment (`make vllm-venv`; `--engines builtin` leaves it out) the big checkpoint again as
"big-vllm", deployed with `engine: vllm` (its pool scenarios take a vLLM pool worker: vLLM
imported before the request), the same objects in the same store; the JSON line's
`vllm_first_token_s` gives its medians.

Columns, and where each comes from (all times are this machine's wall clock, so the client's,
the API's and the worker's timestamps compare):
- total: client, request sent -> first `output` SSE event received (`POST .../run`,
  stream=true). Equals the sum of the six phases; each phase column is its own median.
- target: the bound for the big model ((b) <= weight_stream_s + 0.5 s, (c) <= 0.5 x
  weight_stream_s) and whether the median meets it.
- accept: request sent -> `created_at` of `GET /v1/jobs/{id}` (the API stored the job). The
  API reads a deployment's tokenizer on its first call and keeps it; every round's deployment
  is new, so a refused call reads it first, as for a deployment called before it scaled to
  zero (`first_call_edge_read_s` in the JSON line: what a first call pays on top).
- queue: job created -> the reconciler placed a worker: the worker's `boot` billing record
  starts (`GET /v1/billing/records?worker_id=`), or for a pool worker its `load` record (its
  assignment: the tenant's records of a pool worker start there, with no `boot`).
- boot: the `boot` record: process start, imports, until the worker reports `loading`; 0 for
  a pool worker (it booted before the request, billed to the platform as `pool`).
- load: the `load` record (loading -> warming): config and tokenizer reads, weight streaming,
  model build and the engine's KV cache. The worker's log line "loaded N tensors (...)" in
  STATE/logs/workers/<id>.log splits it (files / header / fetch / build) and names the tier
  ("N cache hits {'host': 1}"; no hits: object storage); the rest of `load` is the engine.
- warm: the `warm` record (warming -> idle): one short generation.
- token: worker idle -> first `output` event at the client: delivery, claim, prefill, the
  first decode step and the event's way through Redis and the API.
- placement: the deployment's `scaling.placement.choice` (pool_host_tier | pool | boot).
weight_stream_s: the loader alone (`loader.load("s3://...")`, default options, no tiers), in a
fresh process, streaming the same object from the same store, once per round on each platform;
once more, untimed, right after the upload (the first read of a fresh object is ~2x slower on
this store, and would otherwise fall on round 1's first scenario only).
The targets' lines also give (a) - (b), the boot the pool removes, next to (a)'s boot phase.

Big weights go into the tenant's namespace straight through S3 (`--upload s3`, the default;
where `store://x/` lives is found from a marker file put through the API), since uploading
1.16 GB through the API is slow for now; `--upload api` uses `platform models upload`.
The parts live in bench/coldstart/: phases, worker_log, sse, report (pure), scenarios (data),
models, driver (the platform), rounds, main.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder is sys.path[0] and `import loader` would import
# bench/loader.py instead of the loader package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if __name__ == "__main__":
    from bench.coldstart.main import main

    main(__doc__ or "")
