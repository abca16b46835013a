"""Code both sides import: the wire contract between the control plane and its workers
(`protocol`: Redis keys, `Assignment`, `Claim`, reports), the JSON-lines logs (`logs`), traces
(`tracing`), signal handling (`signals`), the interpreter's heap setup (`heap`), and what both
read of a model's files (`model_config`: config.json; `tokenizer`).

It imports nothing heavy (no torch, no web framework): `control_plane/` and `worker/` both
depend on it, and it on neither.
"""
