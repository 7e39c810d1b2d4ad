"""The ranks of a data-parallel job resume from the same checkpoint, or refuse together (grpo/distributed.py).

Two real gloo processes: a rank that found no checkpoint (its box saw another data dir) beside one that resumed at
step 2 trained on from step 0, its adapter and gradients out of step, until rank 0 ran out of steps and rank 1
crashed; on a 2-node loopback job whose node 1 had its own data dir, rank 0 reported 6 of 6 steps done."""

from __future__ import annotations

import torch.multiprocessing as mp


def _rank(rank: int, store: str, steps: list, out: str) -> None:
    import torch.distributed as dist

    from appliance.errors import ApplianceError
    from appliance.grpo.distributed import RankInfo, check_resumed_together

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        check_resumed_together(RankInfo(rank, 2, rank, "cpu"), steps[rank])
        result = "agreed"
    except ApplianceError as error:
        result = f"{error.exit_code}: {error}"
    finally:
        dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as file:
        file.write(result)


def _resume(tmp_path, steps: list) -> list:
    out = tmp_path / f"result-{steps}"
    # Forked: torch is already imported here, so two ranks start in well under a second.
    mp.start_processes(_rank, args=(str(tmp_path / f"store-{steps}"), steps, str(out)), nprocs=2, start_method="fork")
    return [(tmp_path / f"{out.name}.{rank}").read_text() for rank in (0, 1)]


def test_ranks_that_resumed_from_different_checkpoints_refuse_together(tmp_path):
    assert _resume(tmp_path, [2, 2]) == ["agreed", "agreed"]
    assert _resume(tmp_path, [None, None]) == ["agreed", "agreed"]
    for steps in ([2, None], [None, 3], [4, 2]):
        refused = _resume(tmp_path, steps)
        assert refused[0] == refused[1] and refused[0].startswith("2: the job's ranks resumed from different"), refused
        assert "same data dir" in refused[0]
