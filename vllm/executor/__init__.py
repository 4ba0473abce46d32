"""Executors: how the engine's Worker calls reach the model's ranks (one process, or one per
tensor-parallel rank through multiprocessing or Ray)."""
from vllm.lazy_exports import lazy_exports

__getattr__ = lazy_exports(__name__, {"Executor": "executor_base",
                                      "create_executor": "executor_base"})
