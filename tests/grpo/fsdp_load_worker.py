"""Load a base whole (one process) or sharded at load (each rank of a torchrun launch), measure the memory it took,
then run one GRPO update on a fixed batch and save the adapter.

    python fsdp_load_worker.py MODEL_DIR OUT_DIR                      # one rank, the whole base
    python -m torch.distributed.run --nproc-per-node 2 fsdp_load_worker.py MODEL_DIR OUT_DIR   # sharded at load

Writes OUT_DIR/rank<R>.pt: the resident and peak RSS the load added, the layer weights held, the adapter and loss.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

from appliance.budget.device_probe import process_rss_bytes
from appliance.budget.host_allocator import pin_mmap_threshold
from appliance.config.schema import GrpoSpec, StudentSpec
from appliance.grpo.distributed import GradientReducer, destroy_process_group, init_process_group, process_role, share
from appliance.grpo.fsdp import layer_elements_held
from appliance.grpo.student import Student
from appliance.grpo.update import GrpoUpdater, TrainSample, make_optimizer, make_scheduler


def fixed_batch(vocab: int) -> list[TrainSample]:
    generator = torch.Generator().manual_seed(1)
    return [
        TrainSample(
            torch.randint(10, vocab, (5,), generator=generator).tolist(),
            torch.randint(10, vocab, (4 + index,), generator=generator).tolist(),
            advantage=float((-1) ** index),
        )
        for index in range(4)
    ]


def _warm_up(model_dir: Path) -> None:
    """Import and touch what loading a student uses, so the measurement holds the weights alone."""
    import accelerate  # noqa: F401
    import bitsandbytes  # noqa: F401
    import peft  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM

    from appliance.models.causal_lm import load_tokenizer

    load_tokenizer(model_dir)
    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        AutoModelForCausalLM.from_config(config)


def _touch(model: torch.nn.Module) -> None:
    """Read every weight this rank holds (its local shard of a sharded one)."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for parameter in model.parameters():
            (parameter.to_local() if isinstance(parameter, DTensor) else parameter).sum()


def main(model_dir: Path, out_dir: Path) -> None:
    world = process_role(several=False)
    sharded = world.world_size > 1
    if sharded:
        init_process_group(world)
    spec = StudentSpec.model_validate({"model": str(model_dir), "quantization": "none", "lora": {"rank": 4}})
    pin_mmap_threshold()  # as the trainer does: what the load frees goes back to the OS
    _warm_up(model_dir)  # the libraries' own memory is not the base's
    torch.manual_seed(0)
    before = process_rss_bytes()
    student = Student(spec, model_dir, "cpu", shard_over=world if sharded else None)
    _touch(student.model)  # weights mapped from the checkpoint file count once read, as a step reads them
    loaded = process_rss_bytes() - before
    # The process's peak so far is the load's: nothing before it held as much (imports, the process group).
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    with torch.no_grad():  # a non-zero B, so every LoRA matrix gets a gradient
        for name, parameter in student.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5)
    reducer = None
    samples = fixed_batch(student.model.config.vocab_size)
    if sharded:
        reducer = GradientReducer(lockstep=True)
        GradientReducer.broadcast_parameters(student.trainable_parameters())
        samples = share(samples, world.rank, world.world_size)
    grpo = GrpoSpec.model_validate({"learning_rate": 1e-2, "max_new_tokens": 16, "loss": "dapo"})
    optimizer = make_optimizer(student.trainable_parameters(), grpo, "cpu")
    stats = GrpoUpdater(student, optimizer, make_scheduler(optimizer, grpo), grpo, reducer=reducer).step(samples, 2)
    torch.save(
        {
            "loaded_bytes": loaded,
            "peak_bytes": peak,
            "layer_elements": layer_elements_held(student.model),
            "weights": [p.detach().clone() for p in student.trainable_parameters()],
            "loss": stats.loss,
        },
        out_dir / f"rank{world.rank}.pt",
    )
    destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
