"""Llama-family models in torch: configuration, the decoder, paged attention, the runner.

- ``config``: ``ModelConfig.from_hf_dict`` validates a HF ``config.json`` (llama, mistral,
  qwen2, qwen3).
- ``llama``: ``LlamaModel``, a step's flattened tokens over a paged KV cache (and a dense
  path for training).
- ``attention``: cache layout, ``AttentionMetadata``, the plain-torch reference path (CPU).
- ``kernels``: Triton kernels for KV writes and paged attention (CUDA; imported lazily).
- ``runner``: ``ModelRunner``, owns the KV cache, builds a step's batch, samples.
- ``weights``: ``build_model(config, named_tensors)`` checks, fuses and places HF-named
  tensors; ``hf_state_dict`` goes back.
- ``demo``: ``python -m worker.model.demo DIR`` writes a tiny trained checkpoint in HF format.

Errors: bad configs and checkpoints raise ``ValueError`` naming the field or tensor.

Nothing is imported here, so importing a sibling package never pulls in torch by accident.
"""
