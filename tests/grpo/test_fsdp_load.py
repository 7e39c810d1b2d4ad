"""FSDP-QLoRA that shards at load (grpo/fsdp.py): each of 2 gloo ranks reads and keeps only its share of the
decoder layers, so the memory a rank's load takes is a little over half a whole base's, and the update it
then makes equals one rank's with the whole base and the whole batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.model

WORKER = Path(__file__).with_name("fsdp_load_worker.py")
# A rank holds the embeddings and head whole, half the decoder layers, and one whole layer while it is read.
MAX_SHARE_OF_A_WHOLE_LOAD = 0.6


@pytest.fixture(scope="module")
def deep_model_dir(demo_model_dir, tmp_path_factory) -> Path:
    from tiny_model import DEEP, make_tiny_model

    return make_tiny_model(demo_model_dir, tmp_path_factory.mktemp("deep-llama"), shape=DEEP)


def _run(args: list[str]) -> None:
    result = subprocess.run(
        args, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_each_rank_loads_only_its_shard_and_the_update_matches_one_rank(deep_model_dir, tmp_path):
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    whole.mkdir(), sharded.mkdir()
    _run([sys.executable, str(WORKER), str(deep_model_dir), str(whole)])
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", str(WORKER),
          str(deep_model_dir), str(sharded)])  # fmt: skip
    reference = torch.load(whole / "rank0.pt")
    ranks = [torch.load(sharded / f"rank{rank}.pt") for rank in (0, 1)]
    print(
        f"\nwhole base: {reference['loaded_bytes'] / 2**20:.0f} MiB resident, {reference['peak_bytes'] / 2**20:.0f} MiB peak",
        file=sys.stderr,
    )
    for rank, result in enumerate(ranks):
        held, layers = result["layer_elements"]
        assert held == layers // 2, f"rank {rank} holds {held} of {layers} layer weights"
        ratio = result["peak_bytes"] / reference["peak_bytes"]
        print(
            f"rank {rank}: {result['loaded_bytes'] / 2**20:.0f} MiB resident, {result['peak_bytes'] / 2**20:.0f} MiB "
            f"peak, {ratio:.2f}x the whole base's peak",
            file=sys.stderr,
        )
        assert ratio <= MAX_SHARE_OF_A_WHOLE_LOAD, f"rank {rank}'s load peaked at {ratio:.2f}x a whole base's"
        diff = max(float((a - b).abs().max()) for a, b in zip(result["weights"], reference["weights"]))
        assert diff < 1e-5, f"rank {rank}'s adapter differs from the one-rank update by {diff}"
        assert result["loss"] == pytest.approx(reference["loss"], abs=1e-5)
