"""Trace-driven autoscaler simulator (entry point: ``python -m bench.autoscale_sim``).

- ``workloads.py``: traces and the seeded synthetic fleet, with service times fixed up front;
- ``sim.py``: the discrete-event core (workers, requests, ticks, cold-start definition);
- ``ours.py``: the platform's ``control_plane.domain.scaling.decide``, driven like the live loop;
- ``policies.py``, ``oracle.py``: the baselines (keep-alive, Knative KPA, KEDA, the ATC'20
  hybrid histogram) and an oracle that knows the future;
- ``metrics.py``: cold starts, queueing delay, GPU-seconds, boots;
- ``experiment.py``: which runs to make, run in a process pool;
- ``report.py``: tables, the Pareto plot, the final JSON line.
"""
