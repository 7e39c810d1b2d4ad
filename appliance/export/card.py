"""The model card (README.md) of an export, written from the job instead of peft's empty template.

It says what the adapter was trained for (task, system prompt, rewards and
their weights), how (GRPO settings, LoRA, quantization of the base during
training), for how long (steps), how well (training reward at the start and
at the exported step, held-out accuracy before and after where the run
measured it), and how to load it.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _front_matter(card: CardInput) -> str:
    meta = {
        "base_model": card.base_model,
        "library_name": "peft" if card.kind == "adapter" else "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["grpo", "lora", "appliance"] + (["merged"] if card.kind == "merged" else []),
    }
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


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


def render_card(card: CardInput) -> str:
    spec, facts = card.spec, card.facts
    grpo, lora = spec.grpo, spec.student.lora
    what = "LoRA adapter" if card.kind == "adapter" else f"merged model ({card.dtype})"
    lines = [
        _front_matter(card),
        f"# {spec.name}: {what} trained with GRPO\n",
        (
            f"Exported from the appliance job `{spec.name}`, checkpoint `{card.checkpoint}` (step {card.step} of "
            f"{grpo.steps} planned, {facts.steps_recorded} recorded), on the base model `{card.base_model}`."
        ),
    ]
    if card.metric_name:
        value = f"{card.metric_value:.4g}" if card.metric_value is not None else "not recorded"
        lines.append(f"Selected by `{card.metric_name}` = {value}.")
    if card.kind == "merged":
        lines.append(
            f"The LoRA was merged into the base model's original {card.base_model} weights from the model "
            f"store (not the {spec.student.quantization} copy used in training) and saved as {card.dtype}."
        )
    lines += ["", "## Task", "", f"- dataset: `{spec.task.dataset}`"]
    if spec.task.system_prompt:
        lines.append(f"- system prompt: {spec.task.system_prompt!r}")
    if spec.task.few_shot:
        lines.append(f"- few-shot examples: {len(spec.task.few_shot)}")
    lines.append(f"- held-out problems kept out of training: {spec.task.held_out}")
    lines += ["", "## Rewards", "", "| reward | weight |", "|---|---|"]
    lines += [f"| {reward.name} | {reward.weight:g} |" for reward in spec.rewards]
    if spec.judge is not None:
        lines.append(f"\nJudge: `{spec.judge.model}` ({spec.judge.mode})")
    lines += [
        "",
        "## Training",
        "",
        (
            f"- GRPO loss `{grpo.loss}`, group size {grpo.group_size}, {grpo.prompts_per_step} prompts per step, "
            f"learning rate {grpo.learning_rate:g}, temperature {grpo.temperature:g}, beta {grpo.beta:g}, "
            f"max new tokens {grpo.max_new_tokens}"
        ),
        (
            f"- LoRA rank {lora.rank}, alpha {lora.alpha:g}, dropout {lora.dropout:g}, "
            f"targets {', '.join(lora.target_modules)}"
        ),
        f"- student base quantized `{spec.student.quantization}` during training",
        f"- steps trained: {card.step}",
    ]
    if facts.reward_at_step is not None and card.step > 1 and facts.first_reward is not None:
        lines.append(
            f"- training reward (mean): {facts.first_reward:.3f} at step 1, "
            f"{facts.reward_at_step:.3f} at step {card.step}"
        )
    elif facts.reward_at_step is not None:
        lines.append(f"- training reward (mean) at step {card.step}: {facts.reward_at_step:.3f}")
    lines += [
        "",
        "## Held-out accuracy",
        "",
        f"- before training (base model): {_percent(facts.accuracy_before)}",
        f"- after training: {_percent(facts.accuracy_after)}"
        + (f" (step {facts.accuracy_after_step})" if facts.accuracy_after_step is not None else ""),
    ]
    if facts.held_out_problems:
        lines.append(f"- on {facts.held_out_problems} held-out problems, greedy decoding")
    lines += [
        "",
        "## Use",
        "",
        _usage(card),
        "## Files",
        "",
        (
            "`export.json` lists the source job, step and metric, the base model's sha256 and the sha256 of "
            "every file here; `appliance export --check THIS_FOLDER` verifies them."
        ),
        "",
    ]
    return "\n".join(lines)
