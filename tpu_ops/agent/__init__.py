"""What runs on each TPU VM worker: metadata lookups and the per-worker agent commands."""
