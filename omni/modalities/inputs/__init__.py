"""The orchestrator's media steps: from a chat request's media parts to prompt token ids with
every placeholder expanded, and the embedding spans the LLM worker injects.

    items.py          parts -> bytes and a content hash per item; the chat template's view of them
    placeholders.py   the prompt grammar: which token stands for which item and component
    encoder_cache.py  what the artifact store already holds, by key (an in-memory index first)
    pipeline.py       MediaPipeline: ties them together and encodes on a miss

Nothing here is imported by this __init__, so importing one noun does not load the rest.
"""
