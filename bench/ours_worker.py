"""One side of the GRPO step benchmark: a workload (P or V) through our trainer, in this process.

    python bench/ours_worker.py --out RESULT.json [--rollout-weights auto|shared|merged_copy]
        [--workload P|V|F] [--warmup 1] [--measured 3] [--store DATA_DIR] [--memory-budget SIZE]

Builds the trainer the way `appliance train` does (`build_trainer`) in a
throw-away data dir whose model store links to `--store`'s, calls
`train_step()` warm-up + measured times, and writes per-step seconds and this
process's peak RSS (ru_maxrss) to `--out`. Run by bench/grpo_step.py.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401  (must precede every ML import)

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import torch

from scratch_data import link_model_store
from workload import TORCH_THREADS, WORKLOADS, job_spec

# The tests' data dir (their APPLIANCE_TEST_DATA_DIR) when set, as in a git worktree without its own cache.
DEFAULT_STORE = Path(
    os.environ.get("APPLIANCE_TEST_DATA_DIR") or Path(__file__).resolve().parent.parent / ".test-cache" / "data"
)


def run(
    rollout_weights: str, warmup: int, measured: int, store: Path, workload: str = "P", memory_budget: str | None = None
) -> dict:
    from appliance.grpo.distributed import one_process
    from appliance.grpo.run import build_trainer, prepare_job_dir

    torch.set_num_threads(TORCH_THREADS)
    spec = job_spec(rollout_weights, steps=warmup + measured, workload=workload, memory_budget=memory_budget)
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as scratch:
        data_dir = Path(scratch)
        link_model_store(store, data_dir)
        job_dir = prepare_job_dir(data_dir, spec, resume=False, restart=False)
        load_started = time.monotonic()
        trainer = build_trainer(spec, data_dir, data_dir, job_dir, one_process())
        load_seconds = time.monotonic() - load_started
        steps = []
        try:
            for index in range(warmup + measured):
                started = time.monotonic()
                record = trainer.train_step()
                steps.append(
                    {
                        "step": record.step,
                        "warmup": index < warmup,
                        "seconds": time.monotonic() - started,
                        "phases": {k: v for k, v in record.seconds.items() if k != "step"},
                        "completions": record.completions,
                        "generated_tokens": record.generated_tokens["student"],
                        "reward_mean": record.reward_mean,
                        "loss": record.loss,
                        "trained_sequences": record.trained_sequences,
                        "groups_informative": record.groups_informative,
                        "groups_total": record.groups_total,
                        "completion_length_mean": record.completion_length_mean,
                    }
                )
                print(
                    f"ours step {record.step}: {steps[-1]['seconds']:.1f} s, reward {record.reward_mean:.3f}",
                    flush=True,
                )
        finally:
            trainer.close()
        choices = trainer.choices
    return {
        "side": f"ours ({rollout_weights})",
        "workload": workload,
        "requested_rollout_weights": rollout_weights,
        "memory_budget": memory_budget,
        "choices": {
            "rollout_weights": choices.rollout_weights,
            "micro_batch_size": choices.micro_batch_size,
            "gradient_checkpointing": choices.gradient_checkpointing,
            "planned_peak_bytes": trainer.plan.peak_bytes if trainer.plan is not None else None,
            "reasons": choices.reasons,
        },
        "load_seconds": load_seconds,
        "torch_threads": torch.get_num_threads(),
        "steps": steps,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux reports KiB
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rollout-weights", choices=["auto", "shared", "merged_copy"], default="auto")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--measured", type=int, default=3)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="P")
    parser.add_argument("--memory-budget", default=None, help="device.memory_budget of the job (default: 90%%)")
    parser.add_argument("--store", type=Path, default=DEFAULT_STORE, help="data dir whose models/ holds the model")
    args = parser.parse_args()
    result = run(args.rollout_weights, args.warmup, args.measured, args.store, args.workload, args.memory_budget)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
