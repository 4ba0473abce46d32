"""A vLLM-compatible inference engine whose headline feature is heterogeneous speculative
decoding: the target model on the GPU, the draft model (or a model-free proposer) on the CPU."""

__version__ = "0.1.0"
