"""Per-device worker processes: they hold weights and KV tensors and run models.

A folder per worker kind, as vLLM arranges its workers:

    llm/             the LLM runner, its loader, GGUF weights, compiled decode step, memory share
    sample/          the LLM's sampler, penalties and grammar masks
    encoder/         the encoder runner, its components and their checkpoint files
    vision_decoder/  the image decoder runner, the decoder pipeline and its folder layout
    audio_decoder/   the vocoder runner

and what several kinds share: models/ (model code, checkpoint I/O, the LLM registry),
attention/, preprocess/ and tiny/ (the tiny checkpoints). The top keeps only modules used by
more than one kind, or by the server to start one:

    worker.py        the process the server spawns (the only module the server imports)
    runner.py        the Runner interface and the registry of one runner per spec type
    distributed.py   a group's ranks, for any kind that runs as several processes
    store_client.py  the artifact store, blocking (the encoder writes, the LLM reads)
    artifacts.py     embeddings as store bytes and back (the encoder's format, the LLM's input)
    staging.py       a step's host->device inputs in one copy (llm/ and sample/ both stage)
"""
