"""Held-out accuracy against training time for a job file, over several seeds, two settings side by side.

One run is not evidence: seeds move the curve. Each run is a real `appliance
train --eval` in a child process (its own scratch data dir that sees the model
store), with held-out evaluation every `--eval-every` steps on the first
`--eval-limit` held-out problems (greedy; the same problems for every run).
Training time is the sum of the steps' seconds less their evaluation seconds
(model loading and the evaluations themselves are not training). Runs
alternate between the two settings (A, B, A, B, ... per seed) so that a
change in the box's load hits both alike.

    python bench/learning_curve.py examples/multiply-plain.yaml --seeds 0 1 2 \\
        --compare grpo.dynamic_sampling=true --eval-every 5 --eval-limit 50 \\
        [--set grpo.steps=40 ...] [--budget-minutes 8] [--data-dir DIR] [--out FILE.json]

A is the job with the `--set` overrides, B is A with the `--compare` ones too
(no --compare: A alone). Each point is an evaluation step with the mean and
spread (sample std, min, max) over seeds of accuracy and of training minutes;
`--budget-minutes` adds each setting's accuracy gain at the last evaluation
within that much training (mean and spread). The JSON is rewritten after
every run, so an interrupted bench keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratch_data import link_model_store  # noqa: E402


def parse_override(text: str) -> tuple[list[str], object]:
    """'grpo.learning_rate=1e-4' -> (['grpo', 'learning_rate'], 0.0001): the value is read as YAML."""
    key, sep, value = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise SystemExit(f"override {text!r} must be SECTION.KEY=VALUE, e.g. grpo.learning_rate=1e-4")
    parsed = yaml.safe_load(value)
    if isinstance(parsed, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
        try:
            parsed = float(parsed)
        except ValueError:
            pass
    return key.split("."), parsed


def derive_job(job: dict, overrides: list[str], seed: int, eval_every: int, eval_limit: int, base_dir: Path) -> dict:
    """The job with overrides, grpo.seed, held-out evaluation every `eval_every` steps, and file paths absolute."""
    derived = json.loads(json.dumps(job))
    for text in overrides:
        path, value = parse_override(text)
        node = derived
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    derived.setdefault("grpo", {})["seed"] = seed
    derived.setdefault("checkpoint", {}).update({"eval_every": eval_every, "eval_limit": eval_limit})
    dataset = derived.get("task", {}).get("dataset", "")
    if dataset and not dataset.startswith("builtin:") and not Path(dataset).is_absolute():
        derived["task"]["dataset"] = str(base_dir / dataset)
    for reward in derived.get("rewards", []):
        name = reward.get("name", "")
        if ".py:" in name and not Path(name).is_absolute():
            reward["name"] = str(base_dir / name)
    return derived


def curve(metrics: list[dict], before: dict) -> list[dict]:
    """[(step, training seconds, accuracy)] from metrics.jsonl records and eval.json's "before"."""
    points = [{"step": 0, "seconds": 0.0, "accuracy": before["accuracy"]}]
    seconds = 0.0
    for record in metrics:
        spent = record.get("seconds", {})
        seconds += spent.get("step", 0.0) - spent.get("eval", 0.0)
        if record.get("eval"):
            points.append({"step": record["step"], "seconds": seconds, "accuracy": record["eval"]["accuracy"]})
    return points


def _spread(values: list[float]) -> dict:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def aggregate(curves: list[list[dict]]) -> list[dict]:
    """Per evaluation step (the ones every seed has): accuracy and training minutes, mean and spread over seeds."""
    steps = sorted(set.intersection(*({p["step"] for p in c} for c in curves))) if curves else []
    at = [{p["step"]: p for p in c} for c in curves]
    return [
        {
            "step": step,
            "minutes": _spread([points[step]["seconds"] / 60 for points in at]),
            "accuracy": _spread([points[step]["accuracy"] for points in at]),
        }
        for step in steps
    ]


def gain_within(curves: list[list[dict]], minutes: float) -> dict | None:
    """Accuracy gain over step 0 at each seed's last evaluation within `minutes` of training: mean and spread."""
    gains = []
    for points in curves:
        within = [p for p in points if p["seconds"] <= minutes * 60]
        gains.append(within[-1]["accuracy"] - points[0]["accuracy"])
    return _spread(gains) if gains else None


def run_once(job: dict, store: Path, workdir: Path, eval_limit: int) -> list[dict]:
    """One `appliance train --eval` of `job` in a child process: its learning curve."""
    data_dir = workdir / "data"
    link_model_store(store, data_dir)
    job_file = workdir / "job.yaml"
    job_file.write_text(yaml.safe_dump(job, sort_keys=False))
    command = [sys.executable, "-m", "appliance", "train", str(job_file), "--data-dir", str(data_dir)]
    command += ["--eval", "--eval-limit", str(eval_limit)]
    with open(workdir / "train.log", "w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()).returncode
    job_dir = data_dir / "jobs" / job["name"]
    if code != 0:
        raise SystemExit(f"training failed (exit {code}); see {workdir / 'train.log'}")
    metrics = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    return curve(metrics, json.loads((job_dir / "eval.json").read_text())["before"])


def bench(args) -> dict:
    base = yaml.safe_load(args.job.read_text())
    settings = {"A": list(args.set)}
    if args.compare:
        settings["B"] = list(args.set) + list(args.compare)
    result = {
        "job": str(args.job),
        "settings": settings,
        "seeds": args.seeds,
        "eval_every": args.eval_every,
        "eval_limit": args.eval_limit,
        "runs": {name: [] for name in settings},
    }
    with tempfile.TemporaryDirectory(prefix="learning-curve-") as scratch:
        for seed in args.seeds:
            for name, overrides in settings.items():  # alternated: A, B for each seed
                job = derive_job(base, overrides, seed, args.eval_every, args.eval_limit, args.job.resolve().parent)
                workdir = Path(scratch) / f"{name}-seed{seed}"
                workdir.mkdir()
                started = time.monotonic()
                points = run_once(job, args.data_dir, workdir, args.eval_limit)
                result["runs"][name].append({"seed": seed, "wall_seconds": time.monotonic() - started, "curve": points})
                print(f"{name} seed {seed}: " + "  ".join(_point(p) for p in points), flush=True)
                _summarise(result, args.budget_minutes)
                if args.out:
                    args.out.write_text(json.dumps(result, indent=2))
    return result


def _point(point: dict) -> str:
    return f"{point['step']}@{point['seconds'] / 60:.1f}m={point['accuracy']:.0%}"


def _summarise(result: dict, budget_minutes: float | None) -> None:
    for name, runs in result["runs"].items():
        curves = [run["curve"] for run in runs]
        result.setdefault("summary", {})[name] = {
            "points": aggregate(curves),
            **({"gain_within_budget": gain_within(curves, budget_minutes)} if budget_minutes else {}),
        }


def table(result: dict) -> str:
    lines = []
    for name, summary in result.get("summary", {}).items():
        lines.append(f"setting {name}: {' '.join(result['settings'][name]) or '(the job as it is)'}")
        lines.append(f"  {'step':>5} {'minutes':>14} {'accuracy':>24}")
        for point in summary["points"]:
            minutes, accuracy = point["minutes"], point["accuracy"]
            lines.append(
                f"  {point['step']:>5} {minutes['mean']:>7.2f} ±{minutes['std']:<5.2f}"
                f" {accuracy['mean']:>7.1%} ±{accuracy['std']:<6.1%} [{accuracy['min']:.0%}, {accuracy['max']:.0%}]"
            )
        gain = summary.get("gain_within_budget")
        if gain:
            lines.append(f"  gain within budget: {gain['mean']:+.1%} ±{gain['std']:.1%} over {gain['n']} seeds")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", type=Path, help="job YAML file")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="grpo.seed of each run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for both")
    parser.add_argument("--compare", action="append", default=[], metavar="KEY=VALUE", help="setting B's overrides")
    parser.add_argument("--eval-every", type=int, default=5, help="steps between held-out evaluations")
    parser.add_argument("--eval-limit", type=int, default=50, help="held-out problems per evaluation")
    parser.add_argument("--budget-minutes", type=float, default=None, help="report the gain within this training")
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("APPLIANCE_DATA_DIR", ".appliance")))
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    if args.eval_every < 1 or args.eval_limit < 1:
        parser.error("--eval-every and --eval-limit must be at least 1")
    if not (args.data_dir / "models").is_dir():
        parser.error(f"{args.data_dir} has no models/; pass --data-dir of a provisioned store")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    result = bench(args)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
