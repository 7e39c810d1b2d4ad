"""A tiny randomly initialised Llama with the bundled model's tokenizer: real components, seconds not minutes.

The step loop, the updater, checkpoints and resume are exercised on it with
every real part (transformers, peft, torch, our trainer); only the weights are
small and random. A plugin reward scores completion text length, which varies
between random completions, so every group carries signal and trains.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
REWARD_PLUGIN = """
def text_length(prompt, completion, reference, metadata):
    return len(completion) / 100.0
"""


# The tiny model's shape: seconds a step, every real part.
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2}  # fmt: skip
# A model whose decoder layers hold most of its weights (the embeddings under a tenth), as in a large model: what
# sharding the base over ranks is for.
DEEP = {"hidden_size": 64, "intermediate_size": 4096, "num_hidden_layers": 48, "num_attention_heads": 1,
        "num_key_value_heads": 1}  # fmt: skip
# Head dim 64, which vLLM's CPU attention takes, and two heads, which tensor parallelism splits over 2 ranks.
SPLITTABLE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 2}  # fmt: skip


def make_tiny_model(source: Path, target: Path, generation: dict | None = None, shape: dict | None = None) -> Path:
    """A random Llama of `shape` (TINY by default) with the bundled model's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import torch

    torch.manual_seed(0)
    base = json.loads((source / "config.json").read_text())
    config = LlamaConfig(
        vocab_size=base["vocab_size"],
        max_position_embeddings=1024,
        bos_token_id=base["bos_token_id"],
        eos_token_id=base["eos_token_id"],
        pad_token_id=base["pad_token_id"],
        tie_word_embeddings=True,
        **(shape or TINY),
    )
    LlamaForCausalLM(config).save_pretrained(target)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, target / name)
    generation_config = {
        "bos_token_id": base["bos_token_id"],
        "eos_token_id": base["eos_token_id"],
        **(generation or {}),
    }
    (target / "generation_config.json").write_text(json.dumps(generation_config))
    return target


def tiny_job(model_dir: Path, folder: Path, **sections) -> Path:
    """A job file in `folder` (with its reward plugin) training the tiny model; sections override keys."""
    (folder / "rewards.py").write_text(REWARD_PLUGIN)
    job = {
        "name": "tiny",
        "student": {"model": str(model_dir), "quantization": "none", "lora": {"rank": 4, "alpha": 8}},
        "task": {
            "dataset": "builtin:multiply",
            "operand_min": 2,
            "operand_max": 12,
            "held_out": 8,
            "system_prompt": "Reply with the answer in the form <answer>N</answer>.",
        },
        "rewards": [{"name": "rewards.py:text_length", "weight": 1.0}],
        "grpo": {
            "group_size": 4,
            "prompts_per_step": 2,
            "max_new_tokens": 12,
            "learning_rate": 1.0e-3,
            "steps": 3,
            "micro_batch_size": 8,
            "temperature": 1.0,
        },
        "engine": {"rollout": "hf", "rollout_weights": "shared"},
        # No held-out evaluation unless a test asks (eval_every: auto would evaluate the last step).
        "checkpoint": {"every": 2, "keep_last": 2, "eval_every": None},
    }
    for section, values in sections.items():
        job[section] = {**job.get(section, {}), **values} if isinstance(values, dict) else values
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path
