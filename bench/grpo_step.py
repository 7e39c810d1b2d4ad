"""GRPO step benchmark: workload P through our trainer and through TRL's GRPOTrainer, side by side.

    python bench/grpo_step.py [--measured 3] [--warmup 1] [--sides ours,ours-shared,trl]
        [--trl-python /work/.venv-trl/bin/python] [--out bench/results/grpo_step.json]

Workload P (bench/workload.py): SmolLM2-135M-Instruct, NF4 + LoRA r16 on
q/k/v/o, fp32 compute, 2 prompts x 8 completions per step, <= 32 new tokens,
multiply prompts, rewards correctness + answer_format, 1 warm-up step then 3
measured steps, 2 torch threads. Each side runs in its own subprocess, one
after another (never concurrently), so its peak RSS is that process's
ru_maxrss. Sides:

    ours         our trainer, rollout weights chosen by the memory budget
    ours-shared  our trainer, `engine.rollout_weights: shared` (generate through the 4-bit weights)
    trl          TRL GRPOTrainer in /work/.venv-trl (bench/requirements-trl.txt)

Prints seconds per step, completions per second and peak RSS of each side and
the ratios ours / TRL, and writes everything (per-step figures, the load
average before and after) to --out.
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

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_DIR = BENCH_DIR.parent
DEFAULT_TRL_PYTHON = Path("/work/.venv-trl/bin/python")
SIDES = ("ours", "ours-shared", "trl")


def worker_command(side: str, trl_python: Path, out: Path, warmup: int, measured: int) -> list[str]:
    steps = ["--warmup", str(warmup), "--measured", str(measured), "--out", str(out)]
    if side == "trl":
        return [str(trl_python), str(BENCH_DIR / "trl_worker.py"), *steps]
    weights = "shared" if side == "ours-shared" else "auto"
    return [sys.executable, str(BENCH_DIR / "ours_worker.py"), "--rollout-weights", weights, *steps]


def run_side(side: str, trl_python: Path, warmup: int, measured: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(PROJECT_DIR), OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
    with tempfile.TemporaryDirectory(prefix="bench-side-") as scratch:
        out = Path(scratch) / "result.json"
        started = time.monotonic()
        print(f"--- {side}: starting", flush=True)
        subprocess.run(worker_command(side, trl_python, out, warmup, measured), env=env, cwd=PROJECT_DIR,
                       check=True)
        result = json.loads(out.read_text())
    result["wall_seconds"] = time.monotonic() - started
    result["load_average_after"] = os.getloadavg()
    return summarise(result)


def summarise(result: dict) -> dict:
    measured = [step for step in result["steps"] if not step["warmup"]]
    seconds = sum(step["seconds"] for step in measured)
    completions = sum(step["completions"] for step in measured)
    result["seconds_per_step"] = seconds / len(measured)
    result["seconds_per_step_stdev"] = statistics.stdev(s["seconds"] for s in measured) if len(measured) > 1 else 0.0
    result["completions_per_second"] = completions / seconds
    return result


def ratios(ours: dict, trl: dict) -> dict:
    """ours / TRL: below 1 is better for seconds and memory, above 1 is better for completions/s."""
    return {
        "seconds_per_step": ours["seconds_per_step"] / trl["seconds_per_step"],
        "completions_per_second": ours["completions_per_second"] / trl["completions_per_second"],
        "peak_rss": ours["peak_rss_bytes"] / trl["peak_rss_bytes"],
    }


def table(results: dict[str, dict]) -> str:
    lines = [f"{'side':<14}{'s/step':>10}{'compl/s':>10}{'peak RSS GiB':>14}{'load s':>9}  rollout weights"]
    for side, r in results.items():
        weights = r.get("choices", {}).get("rollout_weights", "-")
        lines.append(f"{side:<14}{r['seconds_per_step']:>10.1f}{r['completions_per_second']:>10.3f}"
                     f"{r['peak_rss_bytes'] / 2**30:>14.2f}{r['load_seconds']:>9.1f}  {weights}")
    if "trl" in results:
        for side in (s for s in results if s != "trl"):
            q = ratios(results[side], results["trl"])
            lines.append(f"{side} / trl: s/step x{q['seconds_per_step']:.2f}, completions/s "
                         f"x{q['completions_per_second']:.2f}, peak RSS x{q['peak_rss']:.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--measured", type=int, default=3)
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated subset of {', '.join(SIDES)}")
    parser.add_argument("--trl-python", type=Path, default=DEFAULT_TRL_PYTHON)
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "grpo_step.json")
    args = parser.parse_args()
    sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    unknown = [side for side in sides if side not in SIDES]
    if unknown:
        parser.error(f"--sides: unknown {', '.join(unknown)}; choose from {', '.join(SIDES)}")
    if args.measured < 1:
        parser.error("--measured must be at least 1")
    if "trl" in sides and not args.trl_python.is_file():
        parser.error(f"--trl-python: {args.trl_python} does not exist; create the TRL venv as bench/README.md says")

    load_before = os.getloadavg()
    results = {side: run_side(side, args.trl_python, args.warmup, args.measured) for side in sides}
    report = {
        "workload": "P", "warmup_steps": args.warmup, "measured_steps": args.measured,
        "load_average_before": load_before, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sides": results,
        "ratios_vs_trl": {side: ratios(r, results["trl"]) for side, r in results.items() if side != "trl"}
        if "trl" in results else {},
    }
    print(table(results))
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} (1 min)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
