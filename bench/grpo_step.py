"""GRPO step benchmark: a workload through our trainer and through TRL's GRPOTrainer, side by side.

    python bench/grpo_step.py [--workloads P,V] [--measured 3] [--warmup 1] [--sides ours,ours-shared,trl]
        [--rounds 1] [--baseline trl] [--trl-python /work/.venv-trl/bin/python] [--out bench/results/grpo_step.json]

    python bench/grpo_step.py --workloads V --sides ours,trl --rounds 5    # the decision: five alternated rounds

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
    ours-lean    our trainer under a memory budget of 0.8x TRL's measured peak (workload.LEAN_MEMORY_BUDGETS):
                 the budget manager picks checkpointing, rollout weights and batches to fit it
    trl          TRL GRPOTrainer in /work/.venv-trl (bench/requirements-trl.txt)

With --rounds N every workload runs N rounds, the sides' order alternating
(ours, TRL; TRL, ours; ...), each side's load average recorded before and
after it runs. Prints each round's table and ratios to the baseline side, then
the median ratio over the rounds and the worst round (completions/s and peak
RSS), and writes everything to --out.
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
from workload import LEAN_MEMORY_BUDGETS, WORKLOADS  # noqa: E402

DEFAULT_TRL_PYTHON = Path("/work/.venv-trl/bin/python")
SIDES = ("ours", "ours-shared", "ours-lean", "trl")


LOAD_SAMPLE_SECONDS = 10


def worker_command(side: str, trl_python: Path, out: Path, warmup: int, measured: int, workload: str) -> list[str]:
    steps = ["--warmup", str(warmup), "--measured", str(measured), "--out", str(out), "--workload", workload]
    if side == "trl":
        return [str(trl_python), str(BENCH_DIR / "trl_worker.py"), *steps]
    weights = "shared" if side == "ours-shared" else "auto"
    if side == "ours-lean":
        steps += ["--memory-budget", LEAN_MEMORY_BUDGETS[workload]]
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


def table(results: dict[str, dict], baseline: str = "trl") -> str:
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
    if baseline in results:
        for side in (s for s in results if s != baseline):
            q = ratios(results[side], results[baseline])
            lines.append(
                f"{side} / {baseline}: s/step x{q['seconds_per_step']:.2f}, completions/s "
                f"x{q['completions_per_second']:.2f}, peak RSS x{q['peak_rss']:.2f}"
            )
    return "\n".join(lines)


def round_summary(rounds: list[dict], baseline: str) -> dict:
    """Per side against the baseline over the rounds: the median and the worst round's ratios.

    rounds: one {side: result} per round. Worst: the lowest completions/s ratio and the highest peak RSS ratio
    (each with its round, 1-based), since one bad round decides whether a claim holds.
    """
    summary = {}
    sides = [side for side in rounds[0] if side != baseline] if rounds and baseline in rounds[0] else []
    for side in sides:
        per_round = [ratios(r[side], r[baseline]) for r in rounds]
        speed = [q["completions_per_second"] for q in per_round]
        memory = [q["peak_rss"] for q in per_round]
        summary[side] = {
            "completions_per_second": {
                "median": statistics.median(speed),
                "worst": min(speed),
                "worst_round": speed.index(min(speed)) + 1,
                "per_round": speed,
            },
            "peak_rss": {
                "median": statistics.median(memory),
                "worst": max(memory),
                "worst_round": memory.index(max(memory)) + 1,
                "per_round": memory,
            },
        }
    return summary


def summary_lines(summary: dict, baseline: str, rounds: list[dict]) -> str:
    lines = []
    for index, results in enumerate(rounds, 1):
        loads = ", ".join(
            f"{side} {r['load_average']['start']:.1f}->{r['load_average']['end']:.1f}" for side, r in results.items()
        )
        lines.append(f"round {index} ({' then '.join(results)}): load before->after {loads}")
    for side, s in summary.items():
        speed, memory = s["completions_per_second"], s["peak_rss"]
        lines.append(
            f"{side} / {baseline} over {len(rounds)} rounds: completions/s median x{speed['median']:.2f}, "
            f"worst x{speed['worst']:.2f} (round {speed['worst_round']}); peak RSS median x{memory['median']:.2f}, "
            f"worst x{memory['worst']:.2f} (round {memory['worst_round']})"
        )
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="P,V", help="comma-separated subset of P, V, F (bench/workload.py)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--measured", type=int, default=3)
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated subset of {', '.join(SIDES)}")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per workload, the sides' order alternating")
    parser.add_argument("--baseline", default="trl", help="the side the others' ratios are taken against")
    parser.add_argument("--trl-python", type=Path, default=DEFAULT_TRL_PYTHON)
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "grpo_step.json")
    args = parser.parse_args()
    args.sides = [side.strip() for side in args.sides.split(",") if side.strip()]
    unknown = [side for side in args.sides if side not in SIDES]
    if unknown:
        parser.error(f"--sides: unknown {', '.join(unknown)}; choose from {', '.join(SIDES)}")
    if args.measured < 1 or args.rounds < 1:
        parser.error("--measured and --rounds must be at least 1")
    if "trl" in args.sides and not args.trl_python.is_file():
        parser.error(f"--trl-python: {args.trl_python} does not exist; create the TRL venv as bench/README.md says")
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if any(w not in WORKLOADS for w in args.workloads):
        parser.error(f"--workloads: choose from {', '.join(WORKLOADS)}")
    return args


def run_workload(args: argparse.Namespace, workload: str, first_reversed: bool) -> dict:
    rounds = []
    for index in range(args.rounds):
        order = args.sides[::-1] if (index % 2 == 1) != first_reversed else args.sides
        results = {side: run_side(side, args.trl_python, args.warmup, args.measured, workload) for side in order}
        rounds.append(results)
        print(f"workload {workload}, round {index + 1} of {args.rounds}:\n{table(results, args.baseline)}", flush=True)
    summary = round_summary(rounds, args.baseline)
    print(summary_lines(summary, args.baseline, rounds), flush=True)
    last = rounds[-1]
    return {
        "sides": last,  # the last round, as a one-round run always wrote
        "ratios_vs_baseline": {
            side: ratios(r, last[args.baseline]) for side, r in last.items() if side != args.baseline
        }
        if args.baseline in last
        else {},
        "baseline": args.baseline,
        "rounds": rounds,
        "summary": summary,
    }


def main() -> None:
    args = parse_args()
    load_before = os.getloadavg()
    report = {
        "warmup_steps": args.warmup,
        "measured_steps": args.measured,
        "rounds": args.rounds,
        "load_average_before": load_before,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workloads": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for index, workload in enumerate(args.workloads):
        # Each workload starts with the other order than the one before, so that a drift favours no side.
        report["workloads"][workload] = run_workload(args, workload, first_reversed=index % 2 == 1)
        args.out.write_text(json.dumps(report, indent=2))  # after each workload, so a cut-off run keeps the first
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} (1 min)")
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
