"""Prometheus metrics of the control plane (docs/observability.md has every family).

families.py    event families (counters, histograms) observed where things happen, in any
               control-plane process; multiprocess-safe with PROMETHEUS_MULTIPROC_DIR
on_commit.py   observations that wait for their transaction's commit
snapshot.py    state families derived from SQL and Redis at scrape time (a custom collector)
exposition.py  one scrape: the event families (multiprocess files or this process) + state
targets.py     Prometheus HTTP service discovery of the workers' own /metrics
server.py      the reconciler's and Celery's own /metrics (their event families), on a port
"""
