"""Judge quality and speed, every mode side by side in one run: probability, reasoned and generate scoring.

    PYTHONPATH=. python bench/judge_bench.py --data-dir DIR [--rows FILE.jsonl] [--limit N] [--out RESULT.json]
    PYTHONPATH=. python bench/judge_bench.py --model-dir HF_FOLDER --device cuda ...

One judge engine (transformers, float32, the bundled SmolLM2-135M-Instruct by
default) is loaded once and every (mode, scoring) pair runs over the same
labelled rows (default: the shipped appliance/judge/data/judge_set.jsonl)
through `appliance.judge.harness.evaluate_judge`. Printed: the harness table,
and per mode the ratio of seconds per judged completion of reasoned (a
rationale, then the score's probabilities) and generate (a written JSON
answer) over probabilities. Both write with today's defaults (128 new tokens
per judged response, greedy; generate retries twice).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODES = ("pointwise", "group")
SCORINGS = ("probabilities", "reasoned", "generate")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None, help="data dir whose model store holds the judge model")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model store name (with --data-dir)")
    parser.add_argument("--model-dir", type=Path, default=None, help="an HF model folder instead of the store")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--rows", type=Path, default=None, help="labelled JSONL (default: the shipped set)")
    parser.add_argument("--limit", type=int, default=None, help="the first N rows only")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--scorings", default=",".join(SCORINGS))
    parser.add_argument("--max-new-tokens", type=int, default=128, help="reasoned/generate: tokens per judged response")
    parser.add_argument("--out", type=Path, default=None, help="write the reports as JSON here")
    args = parser.parse_args()

    import torch

    from appliance.config.schema import JudgeSpec
    from appliance.engines.hf import HFEngine
    from appliance.judge.harness import evaluate_judge, format_table, load_rows, shipped_set_path
    from appliance.judge.judge import Judge
    from appliance.models.store import resolve_model

    model_dir = args.model_dir or resolve_model(args.model, args.data_dir)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    engine = HFEngine.load(model_dir, compute_dtype=torch.float32, device=device, name=args.model)
    rows = load_rows(args.rows or shipped_set_path())[: args.limit]
    reports = []
    for mode in args.modes.split(","):
        for scoring in args.scorings.split(","):
            spec = JudgeSpec(
                model=args.model,
                mode=mode,
                scoring=scoring,
                max_new_tokens=args.max_new_tokens,
                timeout_seconds=3600,
                cache=False,
            )
            report = evaluate_judge(rows, lambda log_path, spec=spec: Judge(spec, engine, log_path))
            reports.append(report)
            print(format_table([report]).splitlines()[1], flush=True)
    print(format_table(reports))
    by_key = {(r.mode, r.scoring): r for r in reports}
    ratios = {}
    for mode in args.modes.split(","):
        probabilities = by_key.get((mode, "probabilities"))
        for scoring in ("reasoned", "generate"):
            other = by_key.get((mode, scoring))
            if probabilities and other:
                ratio = other.seconds_per_completion / probabilities.seconds_per_completion
                ratios[f"{mode}/{scoring}"] = ratio
                print(
                    f"{mode}: {scoring} {other.seconds_per_completion:.3f} s / probabilities "
                    f"{probabilities.seconds_per_completion:.3f} s per judged completion = {ratio:.1f}x"
                )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "device": device,
                    "model_dir": str(model_dir),
                    "rows": len(rows),
                    "torch": torch.__version__,
                    "reports": [r.to_dict() for r in reports],
                    "over_probabilities": ratios,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
