"""The vLLM engine behind the worker contract, for what the built-in engine cannot run.

The worker process itself runs in the vLLM environment (its own virtualenv or image, with this
project installed beside vLLM); the control plane never imports vLLM. vLLM runs in-process:
its engine core in the worker's own process (one GPU) or its tensor-parallel ranks as
children (`accelerator_count` > 1). `VllmEngine` (engine.py) gives the engine thread
(`worker/runtime/engine_loop.py`) the built-in engine's methods, so claims, hand-offs,
streamed deltas, cancel, priorities, heartbeats, billing phases and metrics are the same code.

- params.py      the job's sampling parameters in vLLM's terms, and vLLM's outputs in ours (pure)
- model_files.py the checkpoint's small files (config, tokenizer) in a local directory
- model_loader.py the weights through the platform's loader (`load_format="platform"`)
- engine.py      `VllmEngine`, and `build_vllm_engine` from an assignment
"""
