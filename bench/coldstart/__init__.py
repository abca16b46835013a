"""The cold-start bench's parts; `bench/cold_start.py` is the entry point and says what it
measures. Pure: phases, worker_log, sse, report; data: scenarios; I/O: models, driver (the
embedded platform), rounds (one timed request); main (the command line)."""
