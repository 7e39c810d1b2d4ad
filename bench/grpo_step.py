"""GRPO step benchmark: a workload through our trainer and through TRL's GRPOTrainer, side by side.

    python bench/grpo_step.py [--workloads P,V] [--measured 3] [--warmup 1] [--sides ours,ours-shared,trl]
        [--trl-python /work/.venv-trl/bin/python] [--out bench/results/grpo_step.json]

Workloads (bench/workload.py): SmolLM2-135M-Instruct, NF4 + LoRA r16 on
q/k/v/o, fp32 compute, 2 prompts x 8 completions per step, <= 32 new tokens,
multiply prompts, 1 warm-up step then 3 measured steps, 2 torch threads;
P rewards correctness + answer_format (most groups all 0), V adds the
`length` rule (a reward spread in every group). Each side runs in its own
subprocess, one after another (never concurrently), so its peak RSS is that
process's ru_maxrss; the load average is sampled every 10 s while it runs.
Workloads run one after the other, the order of the sides reversed for the
second, so that a drift in the machine's load does not favour one side. Sides:

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
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_DIR = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
from workload import WORKLOADS  # noqa: E402

DEFAULT_TRL_PYTHON = Path("/work/.venv-trl/bin/python")
SIDES = ("ours", "ours-shared", "trl")


LOAD_SAMPLE_SECONDS = 10


def worker_command(side: str, trl_python: Path, out: Path, warmup: int, measured: int, workload: str) -> list[str]:
    steps = ["--warmup", str(warmup), "--measured", str(measured), "--out", str(out), "--workload", workload]
    if side == "trl":
        return [str(trl_python), str(BENCH_DIR / "trl_worker.py"), *steps]
    weights = "shared" if side == "ours-shared" else "auto"
    return [sys.executable, str(BENCH_DIR / "ours_worker.py"), "--rollout-weights", weights, *steps]


def run_side(side: str, trl_python: Path, warmup: int, measured: int, workload: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(PROJECT_DIR), OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
    samples, done = [os.getloadavg()[0]], threading.Event()

    def sample_load() -> None:
        while not done.wait(LOAD_SAMPLE_SECONDS):
            samples.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample_load, daemon=True)
    with tempfile.TemporaryDirectory(prefix="bench-side-") as scratch:
        out = Path(scratch) / "result.json"
        started = time.monotonic()
        print(f"--- {workload} {side}: starting", flush=True)
        sampler.start()
        try:
            subprocess.run(
                worker_command(side, trl_python, out, warmup, measured, workload), env=env, cwd=PROJECT_DIR, check=True
            )
        finally:
            done.set()
            sampler.join()
        result = json.loads(out.read_text())
    result["wall_seconds"] = time.monotonic() - started
    result["started"] = time.strftime("%H:%M:%S", time.gmtime(time.time() - result["wall_seconds"]))
    result["load_average"] = {
        "start": samples[0],
        "mean": statistics.fmean(samples),
        "max": max(samples),
        "end": os.getloadavg()[0],
        "samples": len(samples),
    }
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
    lines = [
        f"{'side':<14}{'s/step':>10}{'sd':>7}{'compl/s':>10}{'peak RSS GiB':>14}{'load s':>9}"
        f"{'load avg mean/max':>19}  rollout weights"
    ]
    for side, r in results.items():
        weights = r.get("choices", {}).get("rollout_weights", "-")
        load = r["load_average"]
        lines.append(
            f"{side:<14}{r['seconds_per_step']:>10.1f}{r['seconds_per_step_stdev']:>7.1f}"
            f"{r['completions_per_second']:>10.3f}{r['peak_rss_bytes'] / 2**30:>14.2f}"
            f"{r['load_seconds']:>9.1f}{load['mean']:>12.1f} / {load['max']:<4.1f}  {weights}"
        )
    if "trl" in results:
        for side in (s for s in results if s != "trl"):
            q = ratios(results[side], results["trl"])
            lines.append(
                f"{side} / trl: s/step x{q['seconds_per_step']:.2f}, completions/s "
                f"x{q['completions_per_second']:.2f}, peak RSS x{q['peak_rss']:.2f}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="P,V", help="comma-separated subset of P, V (bench/workload.py)")
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

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if any(w not in WORKLOADS for w in workloads):
        parser.error(f"--workloads: choose from {', '.join(WORKLOADS)}")

    load_before = os.getloadavg()
    report = {
        "warmup_steps": args.warmup,
        "measured_steps": args.measured,
        "load_average_before": load_before,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workloads": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for index, workload in enumerate(workloads):
        order = sides if index % 2 == 0 else sides[::-1]
        results = {side: run_side(side, args.trl_python, args.warmup, args.measured, workload) for side in order}
        report["workloads"][workload] = {
            "sides": results,
            "ratios_vs_trl": {side: ratios(r, results["trl"]) for side, r in results.items() if side != "trl"}
            if "trl" in results
            else {},
        }
        print(f"workload {workload}:\n{table(results)}", flush=True)
        args.out.write_text(json.dumps(report, indent=2))  # after each workload, so a cut-off run keeps the first
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} (1 min)")
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
