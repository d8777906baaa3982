"""The omni-serve server process: HTTP API, orchestration, supervision. Never runs a model."""
