"""Generation engines behind one interface: transformers (CPU path, the trainer's own weights) and vLLM."""
