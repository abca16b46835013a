"""The inference engine: requests in, streamed outputs out; no I/O.

Pure Python (no torch; ``tests/unit/test_scheduler.py`` checks it):

- ``params``: ``SamplingParams`` (validated).
- ``sequence``: ``Sequence``, one request's tokens and KV-cache state.
- ``block_manager``: ``BlockManager``, paged KV blocks, reference counts, prefix caching
  (chained block hashes, collision-checked), LRU eviction, hit counters.
- ``scheduler``: ``Scheduler``, iteration-level continuous batching under a token budget,
  chunked prefill, preemption by recompute, priority classes.
- ``llm_engine``: ``LLMEngine``, the step loop gluing the scheduler to a model runner, output
  processing (detokenization, stop strings/tokens, finish reasons, timings).
- ``config``, ``outputs``, ``errors``, ``stop``, ``detokenize``: settings, output records,
  exceptions, stop-string matching, incremental UTF-8-safe detokenization.

With torch: ``sampling`` (batched sampler, penalties, per-request generators) and
``generate`` (``Generator``, an iterator-style offline front end). The model runner that
executes steps is ``worker.model.runner.ModelRunner``.

Exceptions::

    ValueError                 bad SamplingParams / EngineConfig field, empty prompt, token id
     │                         out of range, duplicate request id
     └── PromptTooLongError    prompt + max_tokens exceeds the context window or the KV cache
                               (prompt_tokens, max_tokens, limit)

Nothing is imported here, so importing the pure modules never pulls in torch.
"""
