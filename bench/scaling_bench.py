"""Completions/s of one rank vs two data-parallel ranks on the same global batch, runs alternated, load recorded.

Each run is `appliance train` of the CPU demo (bundled SmolLM2-135M, 4-bit or
fp32, 4 prompts x group_size completions a step) with resources.gpus 1 or 2 (two gloo CPU
processes here). Completions/s is completions over step seconds of steps 2..N
(step 1 carries warm-up); the 1-minute load average is read before and after.

    python bench/scaling_bench.py STORE_DATA_DIR [--rounds 2] [--steps 4] [--quantization none]
        [--threads-per-rank 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratch_data import link_model_store  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def job(ranks: int, steps: int, quantization: str, group_size: int) -> dict:
    spec = yaml.safe_load((ROOT / "examples" / "multiply.yaml").read_text())
    spec["name"] = f"scale-{ranks}"
    spec["student"]["quantization"] = quantization
    spec["grpo"].update(steps=steps, prompts_per_step=4, group_size=group_size)
    spec["checkpoint"]["every"] = steps
    spec["resources"] = {"gpus": ranks}
    return spec


def run(store: Path, ranks: int, steps: int, quantization: str, group_size: int, threads: int | None) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        data_dir, job_file = Path(scratch) / "data", Path(scratch) / "job.yaml"
        link_model_store(store, data_dir)
        job_file.write_text(yaml.safe_dump(job(ranks, steps, quantization, group_size)))
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        threads = threads or max(1, (os.cpu_count() or 2) // ranks)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run(
            [sys.executable, "-m", "appliance", "train", str(job_file), "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            env=env,
        )
        if done.returncode:  # say how it ended: a run killed from outside (OOM, a full /tmp) prints nothing itself
            raise SystemExit(
                f"{ranks} rank(s): appliance train ended with code {done.returncode}\n"
                + done.stdout[-2000:]
                + done.stderr[-2000:]
            )
        wall = time.monotonic() - started
        rows = [json.loads(line) for line in (data_dir / "jobs" / f"scale-{ranks}" / "metrics.jsonl").open()]
    timed = rows[1:] or rows
    completions = sum(row["completions"] for row in timed)
    seconds = sum(row["seconds"]["step"] for row in timed)
    return {
        "ranks": ranks,
        "threads_per_rank": threads,
        "completions_per_second": completions / seconds,
        "step_seconds": [round(row["seconds"]["step"], 3) for row in rows],
        "wall_seconds": round(wall, 1),
        "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store", type=Path, help="a data dir whose models/ holds smollm2-135m-instruct")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--quantization", default="nf4", help="nf4 (the demo's) or none (fp32: faster on a CPU)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument(
        "--threads-per-rank",
        type=int,
        default=None,
        help="OpenMP threads of each rank (default: the cores shared among the ranks); 1 on a busy box, where "
        "spinning OpenMP threads of one rank over every core measure the load more than the rank",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = [
        run(args.store, ranks, args.steps, args.quantization, args.group_size, args.threads_per_rank)
        for _ in range(args.rounds)
        for ranks in (1, 2)
    ]
    mean = {r: sum(x["completions_per_second"] for x in runs if x["ranks"] == r) / args.rounds for r in (1, 2)}
    summary = {"runs": runs, "mean_completions_per_second": mean, "scaling_efficiency": mean[2] / (2 * mean[1])}
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    for item in runs:
        print(
            f"{item['ranks']} rank(s) x {item['threads_per_rank']} thread(s): "
            f"{item['completions_per_second']:.2f} completions/s, steps {item['step_seconds']}"
            f", load {item['load_1min_before']:.1f} -> {item['load_1min_after']:.1f}"
        )
    print(f"mean: 1 rank {mean[1]:.2f}/s, 2 ranks {mean[2]:.2f}/s, efficiency {summary['scaling_efficiency']:.0%}")


if __name__ == "__main__":
    main()
