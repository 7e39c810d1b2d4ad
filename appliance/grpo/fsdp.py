"""The student's base sharded over data-parallel ranks with FSDP2 (resources.sharding: fsdp).

torch's `fully_shard` splits the frozen base weights across the ranks, one
group per decoder layer. The embeddings, final norm and LM head (often tied,
a few percent of a large model) stay whole on every rank: the student computes
log-probabilities through the decoder and the head separately (student.py), which
a sharded root group would not gather. A 4-bit base is stored with
`bnb_4bit_quant_storage` equal to the compute dtype (models/causal_lm.py), so its
packed weights shard as float tensors and bitsandbytes re-attaches their
quantization state after each gather (FSDP-QLoRA). The LoRA adapter is left
out (`ignored_params`): it stays whole on every rank, so its gradients are
summed by grpo/distributed.py and its optimizer state, checkpoints, best/ and
the vLLM adapter sync are exactly as under DDP.

Every forward of a sharded model is a collective. The update runs the same
number of passes on every rank (GradientReducer.lockstep pads micro-batches);
generation through the student's own weights, where ranks stop after different
numbers of tokens, runs on the whole weights gathered once for it (`whole_weights`),
as TRL does with FSDP; an engine with weights of its own (vLLM) needs no gather.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from appliance.grpo.distributed import RankInfo


def shard_student(model: torch.nn.Module, rank: RankInfo) -> None:
    """Shard a peft model's base over the world (in place); its trainable parameters stay whole."""
    mesh = init_device_mesh("cuda" if rank.device.startswith("cuda") else "cpu", (rank.world_size,))
    adapter = {parameter for parameter in model.parameters() if parameter.requires_grad}
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, ignored_params=adapter)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a causal LM (peft-wrapped or not): the unit FSDP gathers at a time."""
    decoder = model.get_base_model().get_decoder() if hasattr(model, "get_base_model") else model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise TypeError(f"{type(decoder).__name__} has no .layers to shard; use resources.sharding: ddp")
    return list(layers)


def layer_elements_held(model: torch.nn.Module) -> tuple[int, int]:
    """(elements of the decoder layers' frozen weights this rank holds, of all of them): about 1/world when sharded."""
    from torch.distributed.tensor import DTensor

    frozen = [p for layer in decoder_layers(model) for p in layer.parameters() if not p.requires_grad]
    held = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in frozen)
    return held, sum(p.numel() for p in frozen)


def generates_with(engine, model: torch.nn.Module) -> bool:
    """Whether `engine` generates through `model`'s own weights (the transformers engine on shared weights)."""
    return engine is not None and getattr(engine, "model", None) is model


def remerges_from(engine, model: torch.nn.Module) -> bool:
    """Whether `engine` re-merges its copy from `model`'s base after each update (engines/merged_copy.py)."""
    return engine is not None and getattr(engine, "source_model", None) is model


@contextmanager
def whole_weights(model: torch.nn.Module) -> Iterator[None]:
    """The base's whole weights on this rank for the duration (no collective per forward); sharded again after."""
    groups = [module for module in model.modules() if isinstance(module, FSDPModule)]  # none: nothing to do
    for group in groups:
        group.set_reshard_after_forward(False)
        group.unshard()
    try:
        yield
    finally:
        for group in groups:
            group.reshard()
            group.set_reshard_after_forward(True)
