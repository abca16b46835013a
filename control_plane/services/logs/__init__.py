"""Reading logs for a tenant (`GET /v1/logs`): which logs hold a job's, a worker's or a
deployment's lines (`targets.py`: resolved within the tenant, another's answering as a missing
one), and reading them, all at once or followed (`reading.py`). Which lines the tenant sees is
decided by `domain/log_lines.py` (pure); where a worker's log lives, by its provider
(`providers/logs.py`)."""
