"""What a checkpoint holds of a run, written and read back without pickle; and an in-memory snapshot.

`write_payload` puts the adapter, optimizer, scheduler and RNG state into a
checkpoint folder; `load_payload` restores them (torch.load weights_only=True,
so a job folder cannot carry code). `UpdateSnapshot` keeps the adapter and
optimizer state on the CPU so an update that failed half-way (an
out-of-memory error after the first of several optimizer steps) can be undone
before it is retried.
"""

from __future__ import annotations

from pathlib import Path

import torch

from appliance.errors import CheckpointError
from appliance.grpo.checkpoint import load_tensors, restore_rng_state, rng_state


def adapter_is_finite(student) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in student.trainable_parameters())


def write_adapter(student, folder: Path) -> None:
    """Save the adapter; refuses one holding NaN or inf (nothing non-finite reaches the disk)."""
    if not adapter_is_finite(student):
        raise CheckpointError("the adapter holds NaN or inf values; it was not saved (the previous one stays)")
    student.save_adapter(folder)


def write_payload(folder: Path, student, optimizer, scheduler) -> None:
    write_adapter(student, folder / "adapter")
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    torch.save(rng_state(), folder / "rng.pt")


def load_payload(folder: Path, student, optimizer, scheduler) -> None:
    """Read every file first, then apply: a damaged file raises before anything changes."""
    optimizer_state = load_tensors(folder / "optimizer.pt")
    scheduler_state = load_tensors(folder / "scheduler.pt")
    rng = load_tensors(folder / "rng.pt")
    student.load_adapter(folder / "adapter")
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(scheduler_state)
    restore_rng_state(rng)


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(item) for item in value)
    return value


class UpdateSnapshot:
    """The trainable parameters and optimizer state at one moment, on the CPU."""

    def __init__(self, student, optimizer):
        self.student, self.optimizer = student, optimizer
        self.parameters = [p.detach().to("cpu", copy=True) for p in student.trainable_parameters()]
        self.optimizer_state = _to_cpu(optimizer.state_dict())

    def restore(self) -> None:
        with torch.no_grad():
            for parameter, saved in zip(self.student.trainable_parameters(), self.parameters):
                parameter.copy_(saved.to(parameter.device))
        self.optimizer.load_state_dict(self.optimizer_state)
