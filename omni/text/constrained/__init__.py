"""Grammar-constrained decoding, on the server's side of the pipe.

    request field -> GrammarSpec (what was asked) -> GrammarCompiler.compile (llguidance, off the
    event loop, cached by spec) -> CompiledGrammar -> one TokenConstraint per choice
    -> each step: the token bitmask of every constrained request that samples, sent in the Step
    -> the worker masks those logits before sampling -> the sampled token advances the matcher

The masks are computed here, as vLLM's scheduler process does, so the worker stays grammar-
agnostic and the matcher's state lives with the request: a preempted request recomputes KV but
never resamples, so its matcher needs no rewind. llguidance needs neither torch nor a GPU.
"""
