"""The inference engine: it gets a model and a tokenizer object and does no I/O.

- ``sampling``: ``SamplingParams`` (validated) and ``sample(logits, params, generator)``.
- ``detokenize``: ``IncrementalDetokenizer``, token ids in, UTF-8-safe text deltas out.
- ``generate``: ``Generator``, the walking-skeleton loop (one request at a time), streaming
  ``StepOutput``s and returning ``GenerationResult``s.

Exceptions::

    ValueError                 bad SamplingParams field, empty prompt, token id out of range
     └── PromptTooLongError    prompt + max_tokens > context window (prompt_tokens, limit)

Nothing is imported here: the scheduler and block manager to come must stay torch-free.
"""
