"""The run: batches through one traced forward pass per batch, every attributor, every
evaluator; the per-example cache, cost measurement, the ``attribute`` JSONL writer and
benchmark configs (TOML)."""
