"""Control plane: HTTP API, background tasks, autoscaler loop and worker providers.

Never imports torch (DESIGN §2); it talks to workers through `common.protocol` only. At
deploy time it also runs the worker's own pure, torch-free parsers (`common.model_config`,
`loader.header`, `loader.objects`) so that a model is refused by exactly the rules a worker
applies (services/models/model_check.py).
"""
