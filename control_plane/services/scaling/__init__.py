"""The autoscaler's state in Redis: each deployment's arrival history (`arrivals.py`, written
at admission, read by the reconciler) and its latest decision (`scale_decisions.py`, written by
the reconciler, read by the API). The decision itself is `domain/scaling/decide.py`."""
