"""The real GGUF fixtures (smollm2_gguf, qwen05_gguf, qwen15_gguf) come from tests/conftest.py."""
