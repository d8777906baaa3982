"""Pure-Python scheduling: request state, KV block accounting, batching. Never imports torch."""
