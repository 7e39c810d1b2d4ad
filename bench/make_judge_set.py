"""Make the judge-quality set: real completions of the bundled model, labelled by the correctness rule.

    PYTHONPATH=. python bench/make_judge_set.py --data-dir DIR [--out appliance/judge/data/judge_set.jsonl]

Problems: multiply (2..12, the demo job's few-shot prompt) and GSM8K (the
gsm8k-cpu job's system prompt), each problem answered twice by the bundled
SmolLM2-135M-Instruct, greedily and at temperature 1.0 (seeded), so that
right and wrong answers to the same question both occur. Each row is
{"id", "task", "question", "reference", "response", "label"} with label 1 when
the `correctness` reward rule gives 1 (the final number equals the reference),
else 0. One batched generate per task (float32; the committed set was made on CUDA, see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from appliance.config.job_file import load_job  # noqa: E402
from appliance.engines.engine import Sampling  # noqa: E402
from appliance.engines.hf import HFEngine  # noqa: E402
from appliance.models.store import resolve_model  # noqa: E402
from appliance.rewards.rules import correctness  # noqa: E402
from appliance.tasks.load import load_task  # noqa: E402

# (job file whose task section and prompt are used, problems, new tokens). Each problem is answered
# twice: greedily and at temperature 1.0 (seeded), so right and wrong answers to a question both occur.
SOURCES = [
    ("multiply", REPO / "examples" / "multiply.yaml", 70, 24),
    ("gsm8k", REPO / "examples" / "gsm8k-cpu.yaml", 30, 160),
]
TEMPERATURES = (0.0, 1.0)
SEED = 20261122


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="data dir whose model store holds the bundled model"
    )
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="the bundled model's HF folder instead of the store"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (float32 either way)")
    parser.add_argument("--out", type=Path, default=REPO / "appliance" / "judge" / "data" / "judge_set.jsonl")
    args = parser.parse_args()
    import torch

    model_dir = args.model_dir or resolve_model("smollm2-135m-instruct", args.data_dir)
    engine = HFEngine.load(model_dir, compute_dtype=torch.float32, device=args.device, max_batch_size=40)
    rows = []
    for name, job_file, count, new_tokens in SOURCES:
        spec = load_job(job_file)
        task = load_task(spec.task, job_file.parent)
        problems = random.Random(SEED).sample(task.held_out + task.train, count)
        prompts = [engine.render_chat(task.messages(problem)) for problem in problems]
        outputs = [
            engine.generate(prompts, Sampling(max_new_tokens=new_tokens, temperature=t, seed=SEED))
            for t in TEMPERATURES
        ]
        for problem, *answers in zip(problems, *outputs):
            completions = [answer[0] for answer in answers]
            for index, completion in enumerate(completions):
                label = correctness(problem.question, completion.text, problem.answer, problem.metadata)
                rows.append(
                    {
                        "id": f"{problem.id}-{index}",
                        "task": name,
                        "question": problem.question,
                        "reference": problem.answer,
                        "response": completion.text,
                        "label": int(label),
                    }
                )
        print(
            f"{name}: {len(problems) * len(TEMPERATURES)} rows, {sum(r['label'] for r in rows if r['task'] == name)} correct",
            file=sys.stderr,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
