"""One rank of a daemon job that holds several slots (service/slot_assignment.py started it, as worker.py's module).

Rank 0 has the report channel and reports as a one-slot worker does; the
other ranks report nothing (rank 0's step records are the job's, gathered
over every rank). A stop request reaches rank 0 only, so every rank asks
rank 0 once per step, in the same collective: they all stop after the same
step and write its checkpoint together.
"""

from __future__ import annotations

from contextlib import contextmanager


def agreed_stop(local: dict):
    """A stop callable every rank calls once per step: rank 0's pending reason, the same on every rank."""
    import torch.distributed as dist

    def stop_requested() -> str | None:
        box = [local.get("reason")]
        # A collective: every rank must reach it once per step, or the ranks would hang waiting for each other.
        dist.broadcast_object_list(box, src=0)
        return box[0]

    return stop_requested


@contextmanager
def rank_process_group(world):
    """This rank in the job's process group (torchrun's environment), left when the rank ends."""
    from appliance.grpo.distributed import destroy_process_group, init_process_group

    try:
        init_process_group(world)
        yield
    finally:
        destroy_process_group()
