"""appliance: an on-premise GRPO training appliance (4-bit + LoRA student, local judge, one device)."""

__version__ = "0.1.0"
