"""How much a group-mode judge score depends on the order of the group, and on near-copies.

    PYTHONPATH=. .venv/bin/python bench/judge_group_order.py [--questions 6] [--shuffles 8]
        [--model-dir DIR | --data-dir DIR] [--out bench/results/judge_group_order.json]

Probe: the first `--questions` multiply questions of the shipped labelled set,
each with a group of six responses: correct with working ("9 * 5 = 45, so
<answer>45</answer>"), wrong with working (a times b + a), the two bare
answers (<answer>N</answer>), and two near-copies of the correct one with
working (a trailing space; no spaces around * and =). The judge (group mode,
probability scoring, every other key at its default) orders a group from its
seed and the set of texts, so each of `--shuffles` seeds is one shuffle.

Printed: the mean and largest sd of a response's score across the shuffles
(the four distinct responses), in how many of questions x shuffles the correct
response with working beats the wrong one with working, and the largest score
gap between a response and its near-copies. APPLIANCE_SOURCE=/path runs another
version of the code (the "before" figures).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("APPLIANCE_SOURCE", str(REPO)))

KINDS = ("correct_working", "wrong_working", "correct_bare", "wrong_bare", "copy_space", "copy_tight")


def probe_groups(count: int, skip: int = 0) -> list[tuple[str, str, dict[str, str]]]:
    """(question, reference, kind -> response) for `count` multiply questions of the shipped set, after `skip`."""
    from appliance.judge.harness import load_rows, shipped_set_path

    groups, seen = [], set()
    for row in load_rows(shipped_set_path()):
        match = re.fullmatch(r"What is (\d+) \* (\d+)\?", row.question)
        if match is None or row.question in seen:
            continue
        seen.add(row.question)
        a, b = int(match.group(1)), int(match.group(2))
        right, wrong = a * b, a * b + a
        working = f"{a} * {b} = {right}, so <answer>{right}</answer>"
        responses = {
            "correct_working": working,
            "wrong_working": f"{a} * {b} = {wrong}, so <answer>{wrong}</answer>",
            "correct_bare": f"<answer>{right}</answer>",
            "wrong_bare": f"<answer>{wrong}</answer>",
            "copy_space": working + " ",
            "copy_tight": f"{a}*{b}={right}, so <answer>{right}</answer>",
        }
        groups.append((row.question, row.reference, responses))
        if len(groups) == skip + count:
            break
    return groups[skip:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--shuffles", type=int, default=8)
    parser.add_argument("--skip", type=int, default=0, help="start after this many questions (runs in parts)")
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--data-dir", type=Path, default=None, help="data dir whose model store holds the judge")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "judge_group_order.json")
    args = parser.parse_args()

    from appliance.config.schema import JudgeSpec
    from appliance.engines.hf import HFEngine
    from appliance.judge import Judge
    from appliance.models.store import resolve_model
    from appliance.rewards.registry import RewardSample

    data_dir = args.data_dir or Path(os.environ.get("APPLIANCE_TEST_DATA_DIR", ".appliance"))
    engine = HFEngine.load(args.model_dir or resolve_model("smollm2-135m-instruct", data_dir))
    groups = probe_groups(args.questions, args.skip)
    # scores[g][kind] = one score per shuffle
    scores = [{kind: [] for kind in KINDS} for _ in groups]
    started = time.monotonic()
    tokens = 0
    try:
        for seed in range(args.shuffles):
            judge = Judge(JudgeSpec(model="smollm2-135m-instruct", mode="group"), engine, seed=seed)
            samples = [
                RewardSample(question, responses[kind], reference, group=g)
                for g, (question, reference, responses) in enumerate(groups)
                for kind in KINDS
            ]
            for index, score in enumerate(judge(samples)):
                scores[index // len(KINDS)][KINDS[index % len(KINDS)]].append(score)
            tokens += judge.stats()["prompt_tokens"]
            print(f"shuffle {seed}: {[round(s[KINDS[0]][-1], 3) for s in scores]}", flush=True)
    finally:
        engine.close()
    main_kinds = KINDS[:4]
    sds = [statistics.pstdev(group[kind]) for group in scores for kind in main_kinds]
    wins = sum(
        right > wrong for group in scores for right, wrong in zip(group["correct_working"], group["wrong_working"])
    )
    copy_gaps = [
        abs(copy - original)
        for group in scores
        for kind in ("copy_space", "copy_tight")
        for copy, original in zip(group[kind], group["correct_working"])
    ]
    report = {
        "source": os.environ.get("APPLIANCE_SOURCE", str(REPO)),
        "questions": len(groups),
        "shuffles": args.shuffles,
        "sd_mean": statistics.fmean(sds),
        "sd_max": max(sds),
        "spread_between_responses": statistics.fmean(
            statistics.pstdev([statistics.fmean(group[kind]) for kind in main_kinds]) for group in scores
        ),
        "correct_working_beats_wrong_working": wins,
        "orders": len(groups) * args.shuffles,
        "near_copy_gap_max": max(copy_gaps),
        "near_copy_gap_mean": statistics.fmean(copy_gaps),
        "wall_seconds": time.monotonic() - started,
        "prompt_tokens": tokens,
        "scores": scores,
    }
    print(json.dumps({key: value for key, value in report.items() if key != "scores"}, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
