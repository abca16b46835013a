"""Llama-family models in torch: configuration, the decoder, weight placement, the demo model.

- ``config``: ``ModelConfig.from_hf_dict`` validates a HF ``config.json`` (llama, mistral).
- ``llama``: ``LlamaModel`` (the plain-torch reference path) and its contiguous ``KVCache``.
- ``weights``: ``build_model(config, named_tensors)`` checks and places HF-named tensors.
- ``demo``: ``python -m worker.model.demo DIR`` writes a tiny trained checkpoint in HF format.

Errors: bad configs and checkpoints raise ``ValueError`` naming the field or tensor.

Nothing is imported here, so importing a sibling package never pulls in torch by accident.
"""
