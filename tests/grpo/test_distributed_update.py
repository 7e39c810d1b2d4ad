"""Done-when of data-parallel GRPO: 2 gloo ranks with half a batch each update the adapter as 1 rank with all of it
(the base whole on each rank, or sharded over them with FSDP)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.model

WORKER = Path(__file__).with_name("dp_update_worker.py")
CASES = ("grpo", "bnpo", "dr_grpo", "dapo", "dapo-kl", "dapo-2iter", "dapo-kl-nf4", "dapo-engine")


def _run(args: list[str], out: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def updates(tiny_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    one, two = tmp_path_factory.mktemp("one-rank"), tmp_path_factory.mktemp("two-ranks")
    _run([sys.executable, str(WORKER), str(tiny_model_dir), str(one)], one)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone"]
    _run(launcher + [str(WORKER), str(tiny_model_dir), str(two)], two)
    return one, two


@pytest.mark.parametrize("case", CASES)
def test_two_ranks_with_half_each_match_one_rank_with_the_whole_batch(updates, case, tiny_model_dir):
    one, two = updates
    reference = torch.load(one / f"{case}-rank0.pt")
    ranks = [torch.load(two / f"{case}-rank{rank}.pt") for rank in (0, 1)]
    initial = _initial_adapter(tiny_model_dir)
    moved = max(float((a - b).abs().max()) for a, b in zip(reference["weights"], initial))
    assert moved > 1e-4  # the update did something, so equal weights are not equal starting points
    for result in ranks:
        diff = max(float((a - b).abs().max()) for a, b in zip(result["weights"], reference["weights"]))
        assert diff < 1e-5, f"{case}: rank weights differ from the single-rank update by {diff}"
        _same_figures(result, reference, case)


def _same_figures(result: dict, reference: dict, case: str) -> None:
    """The step record's update figures (loss, kl, clip ratio, gradient norm, the engine's logprob gaps) read as one
    rank's with the whole batch; the sample and token counts are the rank's own until the trainer sums them."""
    for figure in ("loss", "kl", "clip_ratio", "grad_norm", "logprob_diff_mean", "logprob_diff_max"):
        assert result[figure] == pytest.approx(reference[figure], abs=1e-5), (case, figure)
    if "engine" in case:
        assert reference["logprob_diff_mean"] > 1e-3, "no logprob gap, so equal gaps would prove nothing"
    if "kl" in case:
        assert reference["kl"] > 1e-6, "the KL term did nothing, so equal figures would prove nothing"
    if "2iter" in case:
        assert reference["clip_ratio"] > 0, "nothing was clipped, so equal clip ratios would prove nothing"


@pytest.fixture(scope="module")
def fsdp_updates(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp-ranks")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone"]
    _run(launcher + [str(WORKER), str(tiny_model_dir), str(out), "fsdp"], out)
    return out


@pytest.mark.parametrize("case", CASES)
def test_two_ranks_with_a_sharded_base_match_one_rank_with_the_whole_batch(updates, fsdp_updates, case):
    """FSDP: each rank holds half of every decoder layer (dapo-kl-nf4: of its 4-bit words, FSDP-QLoRA); rank 1
    (2 of 8 samples) pads its passes to rank 0's 3."""
    one, _ = updates
    reference = torch.load(one / f"{case}-rank0.pt")
    for rank in (0, 1):
        result = torch.load(fsdp_updates / f"{case}-rank{rank}.pt")
        held, whole = result["base_elements_held"]
        assert held == whole // 2, f"rank {rank} holds {held} of {whole} layer weights: the base was not sharded"
        diff = max(float((a - b).abs().max()) for a, b in zip(result["weights"], reference["weights"]))
        assert diff < 1e-5, f"{case}: rank {rank}'s adapter differs from the single-rank update by {diff}"
        _same_figures(result, reference, case)


def _initial_adapter(model_dir: Path) -> list[torch.Tensor]:
    sys.path.insert(0, str(WORKER.parent))
    try:
        from dp_update_worker import student
    finally:
        sys.path.pop(0)
    return [p.detach().clone() for p in student(model_dir, seed=0).trainable_parameters()]


def test_without_the_all_reduce_each_rank_would_move_elsewhere(updates, tiny_model_dir, tmp_path):
    """The fault the reducer guards against: ranks stepping on their own half leave different adapters."""
    one, _ = updates
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone"]
    _run(launcher + [str(WORKER), str(tiny_model_dir), str(tmp_path), "unreduced"], tmp_path)
    reference = torch.load(one / "dapo-rank0.pt")["weights"]
    rank0, rank1 = (torch.load(tmp_path / f"dapo-rank{rank}.pt")["weights"] for rank in (0, 1))
    assert max(float((a - b).abs().max()) for a, b in zip(rank0, rank1)) > 1e-4
    assert max(float((a - b).abs().max()) for a, b in zip(rank0, reference)) > 1e-4


def test_a_several_rank_job_run_as_one_process_is_refused_before_loading(tmp_path):
    """The daemon's worker (and any run_job caller) must not quietly train a 2-rank job on one rank."""
    from appliance.config.job_file import parse_job_text
    from appliance.grpo.distributed import one_process
    from appliance.grpo.run import JobSetupError, build_trainer

    spec = parse_job_text("name: j\nstudent: {model: absent}\nrewards: [{name: correctness}]\nresources: {gpus: 2}\n")
    with pytest.raises(JobSetupError, match="asks for 2 data-parallel rank"):
        build_trainer(spec, tmp_path, tmp_path, tmp_path, one_process())
