"""Tensor parallelism: the process group, its collectives, and how shards are split."""
