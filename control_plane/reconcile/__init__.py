"""The reconciler: small loops, each owning one concern, driven by `driver.Reconciler.tick`.

    workers.py   reap exited workers; fail lost ones (heartbeat, boot overrun)
    jobs.py      requeue orphans; expire; time out overruns; re-send lost wake-ups
    scale.py     drain old versions; decide() and start/stop workers; crash-loop failure
    refresh.py   background thread: boot / service times and the autoscaler's models, refit
    driver.py    the tick order; __main__.py runs it (`python -m control_plane.reconcile`)

Each reconciler is a function of (session, env, now); the policies they apply are pure and live
in `control_plane/domain/` (scaling, fleet, crash_loop).
"""
