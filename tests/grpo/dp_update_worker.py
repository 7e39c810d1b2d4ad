"""One GRPO update per loss aggregation on a fixed batch, in one rank or as one of several (torchrun).

Run as `python dp_update_worker.py MODEL_DIR OUT_DIR` for the single-rank
reference, or under `python -m torch.distributed.run --nproc-per-node 2 ...`
where each rank takes its half of the same batch. Writes the adapter after
the update to OUT_DIR/<case>-rank<R>.pt. With a third argument `unreduced`
the ranks step on their own half without summing (the fault the reducer fixes).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from appliance.config.schema import GrpoSpec, StudentSpec
from appliance.grpo.distributed import (
    GradientReducer,
    destroy_process_group,
    init_process_group,
    launched_rank,
    share,
)
from appliance.grpo.optim import make_optimizer, make_scheduler
from appliance.grpo.student import Student
from appliance.grpo.update import GrpoUpdater, TrainSample

CASES = {
    "grpo": {"loss": "grpo"},
    "bnpo": {"loss": "bnpo"},
    "dr_grpo": {"loss": "dr_grpo"},
    "dapo": {"loss": "dapo"},
    "dapo-kl": {"loss": "dapo", "beta": 0.05},
    "dapo-2iter": {"loss": "dapo", "iterations": 2},
}


def fixed_batch(vocab: int) -> list[TrainSample]:
    """Eight samples of different lengths (token-level aggregations see the difference) and advantages."""
    generator = torch.Generator().manual_seed(1)
    samples = []
    for index in range(8):
        prompt = torch.randint(10, vocab, (4 + index % 3,), generator=generator).tolist()
        completion = torch.randint(10, vocab, (3 + (index * 5) % 11,), generator=generator).tolist()
        samples.append(TrainSample(prompt, completion, advantage=float((-1) ** index * (1 + index / 4))))
    return samples


def student(model_dir: Path, seed: int) -> Student:
    torch.manual_seed(seed)
    spec = StudentSpec.model_validate({"model": str(model_dir), "quantization": "none", "lora": {"rank": 4}})
    built = Student(spec, model_dir, "cpu")
    with torch.no_grad():  # a non-zero B, so every LoRA matrix gets a gradient
        for name, parameter in built.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5)
    return built


def main(model_dir: Path, out_dir: Path, reduce: bool = True) -> None:
    info = launched_rank()
    reducer = None
    if info is not None:
        init_process_group(info)
        reducer = GradientReducer() if reduce else None
    rank = info.rank if info else 0
    for case, grpo in CASES.items() if reduce else [("dapo", CASES["dapo"])]:
        # Ranks start from different seeds: the broadcast must give them rank 0's adapter.
        model = student(model_dir, seed=rank)
        samples = fixed_batch(model.model.config.vocab_size)
        if info is not None:
            GradientReducer.broadcast_parameters(model.trainable_parameters())
            samples = share(samples, info.rank, info.world_size)
        spec = GrpoSpec.model_validate({"learning_rate": 1e-2, "max_new_tokens": 16, **grpo})
        optimizer = make_optimizer(model.trainable_parameters(), spec, "cpu")
        updater = GrpoUpdater(model, optimizer, make_scheduler(optimizer, spec), spec, reducer=reducer)
        stats = updater.step(samples, micro_batch_size=2)
        weights = [p.detach().clone() for p in model.trainable_parameters()]
        torch.save({"weights": weights, "loss": stats.loss}, out_dir / f"{case}-rank{rank}.pt")
    destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), reduce=sys.argv[3:] != ["unreduced"])
