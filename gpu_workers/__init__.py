"""Per-device worker processes: they hold weights and KV tensors and run models."""
