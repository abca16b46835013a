"""The control plane's I/O orchestration, a package per noun it acts on. Routes, Celery tasks
and the reconciler call these; the decisions they apply are pure functions in `domain/`.

    jobs/       a job's life: admission → (hand-off | dispatch) → claim → events → finish, the
                caller's side (end, stream, cancel), webhooks, batches, cold-start progress
    workers/    worker records and their phases; billing segments
    scaling/    the autoscaler's inputs and outputs in Redis (arrivals, latest decisions)
    tenants/    API keys, quotas, the per-process cache of keys, deployments and limits
    storage/    what a tenant may read and with which credentials; files; the object store
    models/     a deployment's model: the deploy-time check, what the API reads of it
    webhooks/   where a webhook may go, signing and one send, a tenant's endpoints
    deployments.py, paging.py, readiness.py

The packages form layers: `jobs` sits on the others, `workers` and `webhooks` on `tenants`,
`models` on `storage`; nothing here imports the API, the reconciler or `worker/`
(tests/unit/test_layout.py checks it).
"""
