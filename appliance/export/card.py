"""The model card (README.md) of an export: card_template.md filled with the job's facts.

What it was trained for, how, for how long, how well (held-out accuracy and
how the evaluation decoded, as the run recorded them) and how to load it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from string import Template

import yaml

from appliance.config.schema import JobSpec
from appliance.export.facts import JobFacts


@dataclass(frozen=True)
class CardInput:
    spec: JobSpec
    facts: JobFacts
    kind: str  # "adapter" | "merged"
    base_model: str
    base_sha256: str
    checkpoint: str
    step: int
    metric_name: str | None
    metric_value: float | None
    dtype: str | None


def _percent(value) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) else "not measured"


TEMPLATE = Path(__file__).with_name("card_template.md")


def _front_matter(card: CardInput) -> str:
    meta = {
        "base_model": card.base_model,
        "library_name": "peft" if card.kind == "adapter" else "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["grpo", "lora", "appliance"] + (["merged"] if card.kind == "merged" else []),
    }
    return yaml.safe_dump(meta, sort_keys=False)


def _usage(card: CardInput) -> str:
    if card.kind == "merged":
        return (
            "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            'model = AutoModelForCausalLM.from_pretrained("THIS_FOLDER")\n'
            'tokenizer = AutoTokenizer.from_pretrained("THIS_FOLDER")\n```\n\n'
            "It loads in vLLM the same way (`vllm serve THIS_FOLDER`).\n"
        )
    return (
        "```python\nfrom peft import PeftModel\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f'base = AutoModelForCausalLM.from_pretrained("PATH_TO/{card.base_model}")\n'
        'model = PeftModel.from_pretrained(base, "THIS_FOLDER")\n'
        'tokenizer = AutoTokenizer.from_pretrained("THIS_FOLDER")\n```\n\n'
        f"Use the base whose files hash to the `base_model.sha256` in export.json ({card.base_sha256[:16]}...).\n"
    )


def decoding(temperature: float | None, samples: int | None) -> str:
    """How the held-out evaluation drew its completions, as its records say."""
    if temperature is None:
        return "decoding not recorded"
    if temperature <= 0:
        return "greedy decoding"
    draws = samples or 1
    return f"{draws} sampled completion{'s' if draws != 1 else ''} each at temperature {temperature:g}"


def _line(text: str | None) -> str:
    """An optional line of the template: itself and its newline, or nothing."""
    return f"{text}\n" if text else ""


def _run_facts(card: CardInput) -> dict[str, str]:
    """How the run went: selection, rewards over the run, held-out accuracy and its decoding."""
    facts = card.facts
    selection = None
    if card.metric_name:
        value = f"{card.metric_value:.4g}" if card.metric_value is not None else "not recorded"
        selection = f"Selected by `{card.metric_name}` = {value}."
    reward = None
    if facts.reward_at_step is not None and card.step > 1 and facts.first_reward is not None:
        reward = (
            f"- training reward (mean): {facts.first_reward:.3f} at step 1, "
            f"{facts.reward_at_step:.3f} at step {card.step}"
        )
    elif facts.reward_at_step is not None:
        reward = f"- training reward (mean) at step {card.step}: {facts.reward_at_step:.3f}"
    after_step = f" (step {facts.accuracy_after_step})" if facts.accuracy_after_step is not None else ""
    held_out = None
    if facts.held_out_problems:
        held_out = (
            f"- on {facts.held_out_problems} held-out problems, "
            f"{decoding(facts.held_out_temperature, facts.held_out_samples)}"
        )
    return {
        "steps_recorded": str(facts.steps_recorded),
        "selection": _line(selection),
        "reward_line": _line(reward),
        "accuracy_before": _percent(facts.accuracy_before),
        "accuracy_after": _percent(facts.accuracy_after) + after_step,
        "held_out_line": _line(held_out),
    }


def _job_facts(card: CardInput) -> dict[str, str]:
    """What the job file says: task, rewards, GRPO and LoRA settings."""
    spec, grpo, lora = card.spec, card.spec.grpo, card.spec.student.lora
    task_lines = ""
    if spec.task.system_prompt:
        task_lines += f"- system prompt: {spec.task.system_prompt!r}\n"
    if spec.task.few_shot:
        task_lines += f"- few-shot examples: {len(spec.task.few_shot)}\n"
    judge = f"\nJudge: `{spec.judge.model}` ({spec.judge.mode})" if spec.judge is not None else None
    return {
        "name": spec.name,
        "steps_planned": str(grpo.steps),
        "dataset": spec.task.dataset,
        "task_lines": task_lines,
        "held_out": str(spec.task.held_out),
        "reward_rows": "".join(f"| {reward.name} | {reward.weight:g} |\n" for reward in spec.rewards),
        "judge_line": _line(judge),
        "loss": grpo.loss,
        "group_size": str(grpo.group_size),
        "prompts_per_step": str(grpo.prompts_per_step),
        "learning_rate": f"{grpo.learning_rate:g}",
        "temperature": f"{grpo.temperature:g}",
        "beta": f"{grpo.beta:g}",
        "max_new_tokens": str(grpo.max_new_tokens),
        "lora_rank": str(lora.rank),
        "lora_alpha": f"{lora.alpha:g}",
        "lora_dropout": f"{lora.dropout:g}",
        "lora_targets": ", ".join(lora.target_modules),
        "quantization": spec.student.quantization,
    }


def card_facts(card: CardInput) -> dict[str, str]:
    """Every value the template names."""
    merge_note = None
    if card.kind == "merged":
        merge_note = (
            f"The LoRA was merged into the base model's original {card.base_model} weights from the model "
            f"store (not the {card.spec.student.quantization} copy used in training) and saved as {card.dtype}."
        )
    return {
        **_job_facts(card),
        **_run_facts(card),
        "front_matter": _front_matter(card),
        "what": "LoRA adapter" if card.kind == "adapter" else f"merged model ({card.dtype})",
        "checkpoint": card.checkpoint,
        "step": str(card.step),
        "base_model": card.base_model,
        "merge_note": _line(merge_note),
        "usage": _usage(card),
    }


def render_card(card: CardInput) -> str:
    # substitute(), not safe_substitute(): a name the template uses and the facts lack is a bug, said at once.
    return Template(TEMPLATE.read_text(encoding="utf-8")).substitute(card_facts(card))
