"""Control plane: HTTP API, background tasks, autoscaler loop and worker providers.

Never imports torch (DESIGN §2); it talks to workers through `worker.protocol` only.
"""
