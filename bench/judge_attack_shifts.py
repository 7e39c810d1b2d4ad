"""How much adversarial suffixes raise the judge's reward, with the job's default judge settings.

    PYTHONPATH=. .venv/bin/python bench/judge_attack_shifts.py [--sets dev,held_out] [--answers 14]
        [--ids ID,ID] [--model-dir DIR | --data-dir DIR] [--out bench/results/judge_attack_shifts.json]

The answers are the first `--answers` wrong answers of the shipped labelled set
(appliance/judge/data/judge_set.jsonl) that do not use the judge prompt's own
`<response>` marker, as tests/judge/adversarial.py picks them. Each suffix of
bench/judge_attacks/<set>.jsonl is appended to every answer (or placed where its `place` says:
`prefix`, or `inside_answer` right after the answer's number; see `attacked`) and the whole batch
is judged in one call, as a training step judges it: pointwise, probability
scoring, `JudgeSpec(model=...)` with every other key at its default (the
guard, and the differential check where the code has one). Per suffix: the
mean shift of the reward against the same answers without it, the largest
shift, how many answers rose (by more than ROSE, the engine's batch-to-batch
noise floor), how many the guard stopped and, where the judge reports it, how
many the differential check capped. The judge's seconds and prompt tokens
for the whole run are printed too.

APPLIANCE_SOURCE=/path/to/a/checkout runs the same measurement against another
version of the code (how the "before" figures in bench/README.md were taken).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("APPLIANCE_SOURCE", str(REPO)))

SETS = REPO / "bench" / "judge_attacks"
# A rise smaller than this is the batch's floating-point noise, not a rise.
ROSE = 0.001


def probe_answers(count: int):
    from appliance.judge.harness import load_rows, shipped_set_path

    wrong = [row for row in load_rows(shipped_set_path()) if row.label < 0.5 and "<response" not in row.response]
    return wrong[:count]


def suffixes(name: str) -> list[dict]:
    return [json.loads(line) for line in (SETS / f"{name}.jsonl").read_text(encoding="utf-8").splitlines() if line]


def attacked(response: str, reference: str | None, attack: dict) -> str:
    """The response with the attack's text placed where the row says (`place`, default after the response);
    in a `template` row "{answer}" and "{ref}" stand for the response's own answer and the reference's."""
    from appliance.rewards.extract import extract_answer, locate_answer, numbers
    from appliance.rewards.fold import fold_with_offsets

    text = attack["suffix"]
    if attack.get("template"):
        text = text.replace("{answer}", extract_answer(response) or "0").replace(
            "{ref}", extract_answer(reference) or "0"
        )
    place = attack.get("place", "suffix")
    if place == "prefix":
        return text + response
    if place == "inside_answer":  # right after the answer's number, inside its markup (before "</answer>")
        folded = fold_with_offsets(response)
        span = locate_answer(folded.text)
        if span is not None:
            number = [n for n in numbers(folded.text, span.start, span.end) if n.value == span.value][0]
            end = folded.original(number.start, number.end)[1]
            return response[:end] + text + response[end:]
    return response + text


def judged(judge, answers, attack: dict | str) -> list[float]:
    from appliance.rewards.registry import RewardSample

    attack = {"suffix": attack} if isinstance(attack, str) else attack
    return judge(
        [
            RewardSample(row.question, attacked(row.response, row.reference, attack), row.reference, group=i)
            for i, row in enumerate(answers)
        ]
    )


def measure(judge, answers, rows: list[dict], clean: list[float]) -> list[dict]:
    results = []
    for row in rows:
        scores = judged(judge, answers, row)
        shifts = [after - before for after, before in zip(scores, clean)]
        capped = getattr(judge, "last_capped", None)
        results.append(
            {
                "id": row["id"],
                "kind": row["kind"],
                "suffix": row["suffix"],
                "mean_shift": statistics.fmean(shifts),
                "max_shift": max(shifts),
                "rose": sum(shift > ROSE for shift in shifts),
                "guarded": sum(bool(signals) for signals in judge.last_injections),
                "capped": None if capped is None else sum(capped),
            }
        )
        print(
            f"{row['id']:<12} {row['kind']:<14} {results[-1]['mean_shift']:+.3f} {results[-1]['max_shift']:+.3f} "
            f"{results[-1]['rose']:>3} {results[-1]['guarded']:>3} {results[-1]['capped']!s:>4}  {row['suffix']!r}",
            flush=True,
        )
    return results


def summary(results: list[dict], answers: int) -> dict:
    return {
        "suffixes": len(results),
        "mean_of_mean_shifts": statistics.fmean(r["mean_shift"] for r in results),
        "largest_mean_shift": max(r["mean_shift"] for r in results),
        "most_rose": max(r["rose"] for r in results),
        "suffixes_over_0.02": sum(r["mean_shift"] > 0.02 for r in results),
        "suffixes_raising_over_half": sum(r["rose"] > answers / 2 for r in results),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="dev,held_out")
    parser.add_argument("--answers", type=int, default=14)
    parser.add_argument("--ids", default=None, help="comma-separated row ids: measure only these")
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--data-dir", type=Path, default=None, help="data dir whose model store holds the judge")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "judge_attack_shifts.json")
    args = parser.parse_args()

    from appliance.config.schema import JudgeSpec
    from appliance.engines.hf import HFEngine
    from appliance.judge import Judge
    from appliance.models.store import resolve_model

    data_dir = args.data_dir or Path(os.environ.get("APPLIANCE_TEST_DATA_DIR", ".appliance"))
    model_dir = args.model_dir or resolve_model("smollm2-135m-instruct", data_dir)
    engine = HFEngine.load(model_dir)
    answers = probe_answers(args.answers)
    report: dict = {"answers": len(answers), "source": os.environ.get("APPLIANCE_SOURCE", str(REPO)), "sets": {}}
    try:
        judge = Judge(JudgeSpec(model="smollm2-135m-instruct"), engine)
        started = time.monotonic()
        clean = judged(judge, answers, "")
        report["clean_scores"] = clean
        for name in args.sets.split(","):
            print(f"== {name}: id, kind, mean shift, max shift, rose, guarded, capped, suffix", flush=True)
            rows = [row for row in suffixes(name) if args.ids is None or row["id"] in args.ids.split(",")]
            results = measure(judge, answers, rows, clean)
            report["sets"][name] = {"summary": summary(results, len(answers)), "suffixes": results}
            print(json.dumps(report["sets"][name]["summary"]), flush=True)
        stats = judge.stats()
        report["judge"] = {
            "wall_seconds": time.monotonic() - started,
            "judge_seconds": stats["seconds"],
            "prompt_tokens": stats["prompt_tokens"],
            "requests": stats["requests"],
        }
        print(json.dumps(report["judge"]))
    finally:
        engine.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
