"""The `vllm` console command (vllm/entrypoints/cli/main.py)."""
