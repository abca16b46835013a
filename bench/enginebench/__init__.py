"""The parts of `bench/engine.py` (`python -m bench.engine`): `workloads` (the requests),
`model` (the random Llama, the summary of a result), `runners` (each system in its own
process)."""
