"""The student's base sharded over data-parallel ranks with FSDP2 (resources.sharding: fsdp), from the load on.

Each rank reads and keeps only its shard (`load_sharded_causal_lm`): the model
is built empty, each decoder layer is read, quantized and handed to torch's
`fully_shard`, which keeps this rank's share, before the next layer is read.
The embeddings, final norm and LM head (a few percent of a large model) stay
whole on every rank: the student computes log-probabilities through the decoder
and the head separately (student.py), which a sharded root group would not
gather. A 4-bit base is stored with `bnb_4bit_quant_storage` equal to the
compute dtype, so its packed weights shard as float tensors and bitsandbytes
re-attaches their quantization state after each gather (FSDP-QLoRA). The LoRA
adapter, added after sharding, is no FSDP parameter: it stays whole on every
rank, so its gradients are summed by grpo/distributed.py and its optimizer
state, checkpoints, best/ and the vLLM adapter sync are exactly as under DDP.

Every forward of a sharded model is a collective. The update runs the same
number of passes on every rank (GradientReducer.lockstep pads micro-batches);
generation through the student's own weights, where ranks stop after different
numbers of tokens, runs on the whole weights gathered once for it (`whole_weights`),
as TRL does with FSDP, and the plan counts that gather; an engine with weights
of its own (vLLM) needs none. It never gathers the base outside those phases.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from appliance.grpo.distributed import RankInfo
from appliance.models.causal_lm import CheckpointTensors, LoadError, empty_causal_lm, fill, frozen


def load_sharded_causal_lm(model_dir: Path, quantization: str, compute_dtype: torch.dtype, world: RankInfo):
    """The model of `model_dir` with its decoder layers sharded over the world: each rank reads and keeps only its
    shard, one layer at a time, so no rank ever holds the whole base (FSDP-QLoRA that shards at load).

    The model is built empty (meta device); each decoder layer is filled from the checkpoint (4-bit weights
    quantized as they land, the same bits from_pretrained gives), then `fully_shard` keeps this rank's share and
    frees the rest before the next layer is read. The embeddings, final norm and head are filled whole: the
    student reads the head directly (student.py), outside any gathered forward.
    """
    model = empty_causal_lm(model_dir, quantization, compute_dtype)
    tensors = CheckpointTensors(model_dir)
    mesh = init_device_mesh(world.device_kind, (world.world_size,))
    decoder_prefix = _layers_prefix(model, tensors)
    for index, layer in enumerate(decoder_layers(model)):
        fill(layer, f"{decoder_prefix}{index}.", tensors, compute_dtype, world.device)
        fully_shard(layer, mesh=mesh)
    fill(model, "", tensors, compute_dtype, world.device)
    model.tie_weights()  # a head tied to the embeddings is not in the checkpoint
    missing = [name for name, parameter in model.named_parameters() if parameter.device.type == "meta"]
    if missing:
        raise LoadError(
            f"{model_dir}: the checkpoint holds no tensor named {missing[0]!r}; a base sharded at load needs a "
            "checkpoint whose tensor names are the model's own (resources.sharding: ddp loads any)"
        )
    return frozen(model)


def _layers_prefix(model: torch.nn.Module, tensors: CheckpointTensors) -> str:
    """`model.layers.` (or wherever the decoder layers are named in the model and its checkpoint)."""
    layers = decoder_layers(model)
    for name, module in model.named_modules():
        if module is layers[0]:
            return name.rpartition(".")[0] + "."
    raise LoadError("the decoder layers are not named in the model")


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
