"""Seconds per step of one job under the daemon (`appliance serve` + `appliance jobs submit`) vs `appliance train`.

The same job file runs both ways, alternately, `--rounds` times each, each
in a fresh data dir that links the provisioned model store. Seconds per step
come from each run's metrics.jsonl (the trainer's own `seconds.step`), the
first `--warmup` steps left out; the ratio is daemon / foreground (goal: at
most 1.05). The daemon side also reports wall time from submit to succeeded.

    /work/.venv/bin/python bench/daemon_overhead.py [--steps 6] [--rounds 2]

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

from daemon_support import Daemon, daemon_env, free_port, link_models, tiny_job  # noqa: E402

DATA = Path(os.environ.get("APPLIANCE_TEST_DATA_DIR", ROOT / ".test-cache" / "data"))
JOB_EXTRA = ""


def job_text(steps: int) -> str:
    return tiny_job("bench", steps=steps).replace("group_size: 2", "group_size: 4").replace(
        "max_new_tokens: 8", "max_new_tokens: 16")


def step_seconds(job_dir: Path, warmup: int) -> list[float]:
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [row["seconds"]["step"] for row in rows if row["step"] > warmup]


def foreground(work: Path, steps: int, warmup: int) -> dict:
    data = link_models(DATA, work / "data")
    job = work / "bench.yaml"
    job.write_text(job_text(steps))
    began = time.monotonic()
    subprocess.run([sys.executable, "-m", "appliance", "train", str(job), "--data-dir", str(data)], check=True,
                   env=daemon_env(), cwd=ROOT, stdout=subprocess.DEVNULL)
    return {"wall_seconds": time.monotonic() - began, "step_seconds": step_seconds(data / "jobs" / "bench", warmup)}


def under_daemon(work: Path, steps: int, warmup: int) -> dict:
    data = link_models(DATA, work / "data")
    job = work / "bench.yaml"
    job.write_text(job_text(steps))
    sockets = Path(tempfile.mkdtemp(prefix="apl-bench-", dir="/tmp"))
    daemon = Daemon(data, sockets / "control.sock", free_port(), work / "daemon.log", [], daemon_env())
    try:
        daemon.start()
        began = time.monotonic()
        submitted = daemon.cli("submit", str(job), "--json")
        job_id = json.loads(submitted.stdout)["job"]["id"]
        daemon.wait_state(job_id, "succeeded", timeout=3600)
        wall = time.monotonic() - began
    finally:
        daemon.close()
        shutil.rmtree(sockets, ignore_errors=True)
    return {"wall_seconds": wall, "step_seconds": step_seconds(data / "jobs" / job_id, warmup)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {"train": [], "daemon": []}
    for round_number in range(args.rounds):
        for side, run in (("train", foreground), ("daemon", under_daemon)):
            with tempfile.TemporaryDirectory(prefix=f"bench-{side}-") as work:
                result = run(Path(work), args.steps, args.warmup)
            result["load_average"] = os.getloadavg()
            runs[side].append(result)
            print(f"round {round_number + 1} {side:>6}: {statistics.mean(result['step_seconds']):.2f} s/step "
                  f"(steps {args.warmup + 1}-{args.steps}), wall {result['wall_seconds']:.1f} s, "
                  f"load {result['load_average'][0]:.1f}", flush=True)
    mean = {side: statistics.mean(s for r in results for s in r["step_seconds"]) for side, results in runs.items()}
    ratio = mean["daemon"] / mean["train"]
    print(f"\nseconds per step: appliance train {mean['train']:.2f}, daemon {mean['daemon']:.2f}, "
          f"ratio {ratio:.3f} (goal <= 1.05)")
    out = ROOT / "bench" / "results" / "daemon_overhead.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"job": job_text(args.steps), "runs": runs, "mean_step_seconds": mean,
                               "ratio": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
