"""The per-device memory plan of two 8 x 80 GB layouts, from the shipped model shapes (no GPU needed).

1. Llama-3.1-8B student (nf4 + LoRA) in 4 DDP ranks, Llama-3.1-70B judge (bf16) under TP=4.
2. Llama-3.1-70B student with FSDP-QLoRA over all 8 GPUs (no judge).

    python bench/scaling_plan.py [--json]
"""

from __future__ import annotations

import json
import sys

from appliance.budget.device_probe import DeviceInfo
from appliance.budget.device_plans import plan_devices
from appliance.budget.shapes import fixture_for, load_config
from appliance.config.job_file import parse_job_text
from appliance.config.sizes import format_bytes

GPU = DeviceInfo("cuda", 80 * 10**9, 0, "80 GB (planned)")
COMMON = """
task: {dataset: builtin:gsm8k}
rewards: [{name: correctness}]
grpo: {group_size: 16, prompts_per_step: 16, max_new_tokens: 768, max_prompt_tokens: 512}
engine: {rollout: vllm, judge: vllm}
"""
LAYOUTS = {
    "8b-student-dp4-70b-judge-tp4": """name: s8b-j70b
student: {model: Llama-3.1-8B-Instruct, quantization: nf4, lora: {rank: 32}, gradient_checkpointing: true}
judge: {model: Llama-3.1-70B-Instruct, quantization: none, mode: group, max_new_tokens: 256}
resources: {gpus: 8, student_gpus: 4, judge_gpus: 4, sharding: ddp}
""",
    "70b-student-fsdp-qlora-8": """name: s70b-fsdp
student: {model: Llama-3.1-70B-Instruct, quantization: nf4, lora: {rank: 16}, gradient_checkpointing: true}
resources: {gpus: 8, sharding: fsdp}
""",
}


def plan(text: str):
    job = parse_job_text(text + COMMON)
    judge = load_config(fixture_for(job.judge.model)) if job.judge else None
    return plan_devices(job, load_config(fixture_for(job.student.model)), judge, GPU)


def main() -> None:
    out = {name: [device.to_dict() for device in plan(text)] for name, text in LAYOUTS.items()}
    if "--json" in sys.argv:
        print(json.dumps(out, indent=2))
        return
    for name, devices in out.items():
        print(name)
        for d in devices:
            parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in d["components"].items() if v)
            print(f"  device {d['index']} {d['role']}: peak {format_bytes(d['peak_bytes'])} fits {d['fits']}: {parts}")


if __name__ == "__main__":
    main()
