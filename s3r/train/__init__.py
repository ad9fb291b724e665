"""Training: optimizer, pure train/eval steps, sharding rules, checkpoints and the I/O loop."""
