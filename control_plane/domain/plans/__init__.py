"""The reconcilers' plans: pure functions of what a tick read and `now`, each returning the
actions (`actions.py`) the one actuator (`control_plane/reconcile/actuator.py`) applies.

    workers.py   exited processes recorded; silent or overdue workers lost
    jobs.py      lost attempts taken back or failed; expiry, overruns; lost wake-ups; stale notes
    scale.py     per deployment, from its `scaling.decide` decision and the crash-loop gate:
                 drains, starts (placed), holds, failures, scale-downs; deleted deployments'
                 workers drained
    pool.py      the warm pool toward its target per accelerator type and engine
    batches.py   a batch topped up to its limit, or completed
    billing.py   open segments rolled after a minute
    webhooks.py  lost `*.completed` deliveries sent again
"""
