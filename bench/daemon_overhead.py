"""Seconds per step of one job under the daemon (`appliance serve` + `appliance jobs submit`) vs `appliance train`.

The same job file runs both ways, alternately (train, daemon, train, daemon,
... : ABAB, `--rounds` runs of each), each in a fresh data dir that links the
provisioned model store. Built for a shared, noisy box: each run reports its
own median, the 1-minute load average before and after it, and the headline
is the ratio of the medians of the per-run medians (daemon / train; goal: at
most 1.05), which one disturbed run cannot move much.

Two measures per step, the first `--warmup` steps left out:
- `step`: the trainer's own `seconds.step` from metrics.jsonl (generate,
  reward, train, sync: the work inside a step);
- `interval`: wall time between consecutive records' `time` stamps (also
  catches what happens between steps: checkpoint writes, the worker's
  reports to the daemon).

    PYTHONPATH=$PWD APPLIANCE_TEST_DATA_DIR=/work/main/.test-cache/data \
        /work/main/.venv/bin/python bench/daemon_overhead.py [--steps 6] [--rounds 2]

Results go to the terminal and to bench/results/daemon_overhead.json (gitignored).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from daemon_support import Daemon, daemon_env, free_port, link_model_store, tiny_job  # noqa: E402

DATA = Path(os.environ.get("APPLIANCE_TEST_DATA_DIR", ROOT / ".test-cache" / "data"))
SIDES = ("train", "daemon")


def job_text(steps: int, group_size: int = 4, max_new_tokens: int = 16) -> str:
    return (
        tiny_job("bench", steps=steps)
        .replace("group_size: 2", f"group_size: {group_size}")
        .replace("max_new_tokens: 8", f"max_new_tokens: {max_new_tokens}")
    )


def step_measures(job_dir: Path, warmup: int) -> dict[str, list[float]]:
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows.sort(key=lambda row: row["step"])
    steps = [row["step"] for row in rows]
    if steps != list(range(1, len(rows) + 1)) or len(rows) <= warmup + 1:
        raise SystemExit(f"{job_dir}/metrics.jsonl: steps {steps}; expected 1..N with N > warmup + 1")
    intervals = [
        later["time"] - earlier["time"] for earlier, later in zip(rows, rows[1:]) if later["step"] > warmup + 1
    ]
    return {"step": [row["seconds"]["step"] for row in rows if row["step"] > warmup], "interval": intervals}


def foreground(work: Path, job_yaml: str, warmup: int) -> dict:
    data = link_model_store(DATA, work / "data")
    job = work / "bench.yaml"
    job.write_text(job_yaml)
    began = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "appliance", "train", str(job), "--data-dir", str(data)],
        check=True,
        env=daemon_env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    return {"wall_seconds": time.monotonic() - began, **step_measures(data / "jobs" / "bench", warmup)}


def under_daemon(work: Path, job_yaml: str, warmup: int) -> dict:
    data = link_model_store(DATA, work / "data")
    job = work / "bench.yaml"
    job.write_text(job_yaml)
    sockets = Path(tempfile.mkdtemp(prefix="apl-bench-", dir="/tmp"))
    daemon = Daemon(data, sockets / "control.sock", free_port(), work / "daemon.log", [], daemon_env())
    try:
        daemon.start()
        began = time.monotonic()
        submitted = daemon.cli("submit", str(job), "--json")
        if submitted.returncode != 0:
            raise SystemExit(f"submit failed: {submitted.stderr}")
        job_id = json.loads(submitted.stdout)["job"]["id"]
        daemon.wait_state(job_id, "succeeded", timeout=3600)
        wall = time.monotonic() - began
    finally:
        daemon.close()
        shutil.rmtree(sockets, ignore_errors=True)
    return {"wall_seconds": wall, **step_measures(data / "jobs" / job_id, warmup)}


def ratio_of_medians(runs: dict[str, list[dict]], measure: str) -> tuple[dict[str, float], float]:
    medians = {side: statistics.median(statistics.median(run[measure]) for run in runs[side]) for side in SIDES}
    return medians, medians["daemon"] / medians["train"]


def pair_ratios(runs: dict[str, list[dict]], measure: str) -> list[float]:
    """daemon / train of each round (adjacent runs): a load that drifts over the whole benchmark shows up
    here as ratios that disagree with each other."""
    return [
        statistics.median(daemon[measure]) / statistics.median(train[measure])
        for train, daemon in zip(runs["train"], runs["daemon"])
    ]


def summarize(runs: dict[str, list[dict]]) -> dict:
    summary = {}
    for measure in ("step", "interval"):
        medians, ratio = ratio_of_medians(runs, measure)
        summary[measure] = {"median_seconds": medians, "ratio": ratio, "round_ratios": pair_ratios(runs, measure)}
        print(
            f"{measure:>8}: median of run medians: train {medians['train']:.3f} s, daemon {medians['daemon']:.3f} s, "
            f"ratio {ratio:.3f} (goal <= 1.05); per round: "
            + ", ".join(f"{r:.3f}" for r in summary[measure]["round_ratios"])
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side, alternating (at least 2)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    job_yaml = job_text(args.steps, args.group_size, args.max_new_tokens)
    if args.rounds < 2 or args.steps < args.warmup + 2:
        parser.error("--rounds must be at least 2 and --steps at least --warmup + 2")
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    print(
        f"{'run':>3}  {'side':>6}  {'s/step med':>10}  {'interval med':>12}  {'wall s':>7}  {'load before':>11}  "
        f"{'load after':>10}",
        flush=True,
    )
    for _ in range(args.rounds):
        for side, run in (("train", foreground), ("daemon", under_daemon)):
            load_before = os.getloadavg()[0]
            with tempfile.TemporaryDirectory(prefix=f"bench-{side}-") as work:
                result = run(Path(work), job_yaml, args.warmup)
            result.update(load_before=load_before, load_after=os.getloadavg()[0])
            runs[side].append(result)
            print(
                f"{len(runs['train']) + len(runs['daemon']):>3}  {side:>6}  "
                f"{statistics.median(result['step']):>10.2f}  {statistics.median(result['interval']):>12.2f}  "
                f"{result['wall_seconds']:>7.1f}  {load_before:>11.2f}  {result['load_after']:>10.2f}",
                flush=True,
            )
    summary = summarize(runs)
    out = ROOT / "bench" / "results" / "daemon_overhead.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {"job": job_yaml, "warmup": args.warmup, "cpus": os.cpu_count(), "runs": runs, "summary": summary}, indent=2
        )
    )
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
