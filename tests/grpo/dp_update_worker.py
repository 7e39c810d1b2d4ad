"""One GRPO update per loss aggregation on a fixed batch, in one rank or as one of several (torchrun).

Run as `python dp_update_worker.py MODEL_DIR OUT_DIR` for the single-rank
reference, or under `python -m torch.distributed.run --nproc-per-node 2 ...`
where each rank takes its half of the same batch. Writes the adapter after
the update to OUT_DIR/<case>-rank<R>.pt. With a third argument `unreduced`
the ranks step on their own half without summing (the fault the reducer fixes);
with `fsdp` the base is sharded over the ranks (grpo/fsdp.py) and rank 0 takes
six of the eight samples, so rank 1 pads its passes to rank 0's count.
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
    process_role,
    share,
)
from appliance.grpo.fsdp import layer_elements_held
from appliance.grpo.update import make_optimizer, make_scheduler
from appliance.grpo.student import Student
from appliance.grpo.update import GrpoUpdater, TrainSample

CASES = {
    "grpo": {"loss": "grpo"},
    "bnpo": {"loss": "bnpo"},
    "dr_grpo": {"loss": "dr_grpo"},
    "dapo": {"loss": "dapo"},
    "dapo-kl": {"loss": "dapo", "beta": 0.05},
    "dapo-2iter": {"loss": "dapo", "iterations": 2},
    "dapo-kl-nf4": {"loss": "dapo", "beta": 0.05},  # a 4-bit base (FSDP-QLoRA when sharded)
    "dapo-engine": {"loss": "dapo"},  # sampled by another engine (vLLM): importance weights, logprob gaps
}
QUANTIZED = {"dapo-kl-nf4"}
ENGINE_SAMPLED = {"dapo-engine"}
# The update's figures a step record carries: a data-parallel job's must read as one rank's with the whole batch.
STEP_FIGURES = ("loss", "kl", "clip_ratio", "grad_norm", "logprob_diff_mean", "logprob_diff_max", "sequences", "tokens")


def fixed_batch(vocab: int, engine_sampled: bool = False) -> list[TrainSample]:
    """Eight samples of different lengths (token-level aggregations see the difference) and advantages;
    engine_sampled: each with the logprobs of an engine that sampled it (about the random model's own)."""
    generator = torch.Generator().manual_seed(1)
    samples = []
    for index in range(8):
        prompt = torch.randint(10, vocab, (4 + index % 3,), generator=generator).tolist()
        completion = torch.randint(10, vocab, (3 + (index * 5) % 11,), generator=generator).tolist()
        engine = (-10.8 - torch.rand(len(completion), generator=generator)).tolist() if engine_sampled else None
        samples.append(TrainSample(prompt, completion, float((-1) ** index * (1 + index / 4)), engine))
    return samples


def uneven_share(samples: list[TrainSample], rank: int) -> list[TrainSample]:
    """Six samples (three micro-batches of 2) to rank 0, two to rank 1: the chunks one rank would form."""
    return samples[:6] if rank == 0 else samples[6:]


def student(model_dir: Path, seed: int, quantization: str = "none", shard_over=None) -> Student:
    """nf4: stored in fp32 words (bnb_4bit_quant_storage) in every mode, so one rank and FSDP hold the same bits;
    shard_over: each rank loads only its shard of the base (FSDP-QLoRA)."""
    torch.manual_seed(seed)
    spec = StudentSpec.model_validate({"model": str(model_dir), "quantization": quantization, "lora": {"rank": 4}})
    built = Student(spec, model_dir, "cpu", shardable=quantization != "none", shard_over=shard_over)
    with torch.no_grad():  # a non-zero B, so every LoRA matrix gets a gradient
        for name, parameter in built.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5)
    return built


def main(model_dir: Path, out_dir: Path, mode: str = "reduced") -> None:
    world = process_role(several=False)
    info = world if world.world_size > 1 else None
    reducer = None
    if info is not None:
        init_process_group(info)
        reducer = GradientReducer(lockstep=mode == "fsdp") if mode != "unreduced" else None
    rank = world.rank
    for case, grpo in CASES.items() if mode != "unreduced" else [("dapo", CASES["dapo"])]:
        # Ranks start from different seeds: the broadcast must give them rank 0's adapter.
        sharded = info if mode == "fsdp" else None
        model = student(model_dir, seed=rank, quantization="nf4" if case in QUANTIZED else "none", shard_over=sharded)
        samples = fixed_batch(model.model.config.vocab_size, engine_sampled=case in ENGINE_SAMPLED)
        if info is not None:
            GradientReducer.broadcast_parameters(model.trainable_parameters())
            samples = share(samples, info.rank, info.world_size) if mode != "fsdp" else uneven_share(samples, rank)
        spec = GrpoSpec.model_validate({"learning_rate": 1e-2, "max_new_tokens": 16, **grpo})
        optimizer = make_optimizer(model.trainable_parameters(), spec, "cpu")
        updater = GrpoUpdater(model, optimizer, make_scheduler(optimizer, spec), spec, reducer=reducer)
        stats = updater.step(samples, micro_batch_size=2)
        weights = [p.detach().clone() for p in model.trainable_parameters()]
        torch.save(
            {
                "weights": weights,
                "base_elements_held": layer_elements_held(model.model),
                **{figure: getattr(stats, figure) for figure in STEP_FIGURES},
            },
            out_dir / f"{case}-rank{rank}.pt",
        )
    destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:])
