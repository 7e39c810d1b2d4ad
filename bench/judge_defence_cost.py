"""What the judge's defences cost per step, and what they do to its quality: seconds, prompt tokens, AUC.

    PYTHONPATH=. .venv/bin/python bench/judge_defence_cost.py [--questions 20] [--modes pointwise,group]
        [--differential on,off] [--model-dir DIR | --data-dir DIR] [--out bench/results/judge_defence_cost.json]

Rows: every row of the first `--questions` questions of each task of the
shipped labelled set (real completions of the bundled model: multiply answers
that end at their answer, GSM8K answers that often ramble past it), fed to the
judge in step-sized batches by `appliance.judge.harness.evaluate_judge`, one
engine for every configuration. Per mode and setting of the differential check
(`judge.differential_threshold` 0, or null for off): judge seconds and prompt
tokens per completion, the core readings and capped rewards, AUC, pairwise
accuracy and, in group mode, the position bias. APPLIANCE_SOURCE=/path runs
another version of the code (the "before" figures; it has no differential
setting, so `--differential` is ignored there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("APPLIANCE_SOURCE", str(REPO)))


def probe_rows(questions: int):
    from appliance.judge.harness import load_rows, shipped_set_path

    rows, seen = [], {}
    for row in load_rows(shipped_set_path()):
        asked = seen.setdefault(row.task, [])
        if row.question not in asked:
            if len(asked) == questions:
                continue
            asked.append(row.question)
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--modes", default="pointwise,group")
    parser.add_argument("--differential", default="on,off")
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--data-dir", type=Path, default=None, help="data dir whose model store holds the judge")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "judge_defence_cost.json")
    args = parser.parse_args()

    from appliance.config.schema import JudgeSpec
    from appliance.engines.hf import HFEngine
    from appliance.judge import Judge
    from appliance.judge.harness import evaluate_judge
    from appliance.models.store import resolve_model

    data_dir = args.data_dir or Path(os.environ.get("APPLIANCE_TEST_DATA_DIR", ".appliance"))
    engine = HFEngine.load(args.model_dir or resolve_model("smollm2-135m-instruct", data_dir))
    rows = probe_rows(args.questions)
    has_setting = "differential_threshold" in JudgeSpec.model_fields
    settings = args.differential.split(",") if has_setting else ["(none)"]
    reports = []
    try:
        for mode in args.modes.split(","):
            for setting in settings:
                keys = {"mode": mode}
                if has_setting:
                    keys["differential_threshold"] = 0.0 if setting == "on" else None
                spec = JudgeSpec(model="smollm2-135m-instruct", **keys)
                started = time.monotonic()
                report = evaluate_judge(rows, lambda log, s=spec: Judge(s, engine, log))
                result = {"mode": mode, "differential": setting, "wall_seconds": time.monotonic() - started}
                result.update(report.to_dict())
                reports.append(result)
                print(
                    f"{mode:<9} differential {setting:<6} rows {report.rows}  s/compl {report.seconds_per_completion:.3f}"
                    f"  tok in/compl {report.prompt_tokens_per_completion:.0f}  AUC {report.auc}"
                    f"  pair {report.pairwise_accuracy}  cores {result.get('core_readings')}"
                    f"  capped {result.get('capped')}  pos {result.get('position_bias')}",
                    flush=True,
                )
    finally:
        engine.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {"source": os.environ.get("APPLIANCE_SOURCE", str(REPO)), "rows": len(rows), "reports": reports}
    args.out.write_text(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
