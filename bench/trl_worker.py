"""The TRL side of the GRPO step benchmark: a workload (P, V or F) through TRL's GRPOTrainer, in this process.

    /work/.venv-trl/bin/python bench/trl_worker.py --out RESULT.json [--workload P|V|F] [--warmup 1] [--measured 3]
        [--model DIR]

Runs in its own venv (bench/requirements-trl.txt: TRL needs a newer
transformers than ours) with /work/main on PYTHONPATH, so it gets the same
prompts (bench/workload.py) and our `correctness` / `answer_format` rule
functions wrapped as TRL reward functions. One optimizer step = 2 prompts x 8
generations, like ours. A step's seconds are the wall time between two
`on_step_end` callbacks (the first from `on_train_begin`), generation included.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401  (must precede every ML import)

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import torch

from appliance.rewards import rules
from workload import TORCH_THREADS, WORKLOADS, prompts_in_step_order

_DATA_DIR = os.environ.get("APPLIANCE_TEST_DATA_DIR") or Path(__file__).resolve().parent.parent / ".test-cache" / "data"
DEFAULT_MODEL = Path(_DATA_DIR) / "models" / "smollm2-135m-instruct"


def as_trl_reward(rule, params: dict):
    """Our `fn(prompt, completion, reference, metadata, **params)` as a TRL reward function over a batch.

    Like our step loop, it gives the rule the completion's token count (TRL passes `completion_ids`).
    """

    def reward(prompts, completions, answer, question, completion_ids=None, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        counts = [len(ids) for ids in completion_ids] if completion_ids is not None else [None] * len(texts)
        return [
            rule(q, text, ref, {} if n is None else {"completion_tokens": n}, **params)
            for q, text, ref, n in zip(question, texts, answer, counts)
        ]

    reward.__name__ = rule.__name__
    return reward


def keep_trainable_4bit_layout(model) -> None:
    """Same workaround as appliance/models/causal_lm.py: without it bitsandbytes 0.50 repacks the 4-bit
    weights for its CPU inference kernel at the first no-grad eval generate, and training loses gradients."""
    from bitsandbytes.nn import Linear4bit

    for module in model.modules():
        if isinstance(module, Linear4bit):
            module.support_avx512bf16_for_cpu = False


def run(warmup: int, measured: int, model_dir: Path, workload: str = "P") -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(TORCH_THREADS)
    total = warmup + measured
    rows = prompts_in_step_order(total, workload)

    class StepClock(TrainerCallback):
        def __init__(self):
            self.last = None
            self.seconds: list[float] = []
            self.logs: list[dict] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.last = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.monotonic()
            self.seconds.append(now - self.last)
            self.last = now
            print(f"trl step {state.global_step}: {self.seconds[-1]:.1f} s", flush=True)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.logs.append(dict(logs, step=state.global_step))

    load_started = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir),
        dtype=torch.float32,
        quantization_config=BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        ),
    )
    keep_trainable_4bit_layout(model)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), padding_side="left")
    clock = StepClock()
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as output_dir:
        config = GRPOConfig(
            output_dir=output_dir,
            max_steps=total,
            seed=0,
            per_device_train_batch_size=16,
            gradient_accumulation_steps=1,
            num_generations=8,
            max_completion_length=32,
            temperature=1.0,
            shuffle_dataset=False,
            learning_rate=2.0e-4,
            lr_scheduler_type="constant",
            max_grad_norm=1.0,
            beta=0.0,
            loss_type="dapo",
            epsilon=0.2,
            epsilon_high=0.28,
            scale_rewards="group",
            reward_weights=[weight for weight, _ in WORKLOADS[workload].values()],
            use_vllm=False,
            bf16=False,
            fp16=False,
            use_cpu=True,
            # gradient_checkpointing left at TRL's default (on, since TRL 0.2x's base config), as a user runs it:
            # forcing it off kept every layer's activations and peaked ~1.2 GiB above a plain TRL script.
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[
                as_trl_reward(rules.RULES[name], params) for name, (_, params) in WORKLOADS[workload].items()
            ],
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=LoraConfig(
                r=16,
                lora_alpha=32,
                lora_dropout=0.0,
                task_type="CAUSAL_LM",
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            ),
            callbacks=[clock],
        )
        load_seconds = time.monotonic() - load_started
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        trainer.train()
    steps = [
        {
            "step": index + 1,
            "warmup": index < warmup,
            "seconds": seconds,
            "completions": 16,
            "log": clock.logs[index] if index < len(clock.logs) else {},
        }
        for index, seconds in enumerate(clock.seconds)
    ]
    import trl
    import transformers

    return {
        "side": "trl",
        "workload": workload,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "trainable_parameters": trainable,
        "gradient_checkpointing": bool(config.gradient_checkpointing),
        "load_seconds": load_seconds,
        "torch_threads": torch.get_num_threads(),
        "steps": steps,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux reports KiB
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--measured", type=int, default=3)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="P")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="HF folder of SmolLM2-135M-Instruct")
    args = parser.parse_args()
    result = run(args.warmup, args.measured, args.model, args.workload)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
