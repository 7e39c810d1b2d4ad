"""Drain and resume through the daemon's control API: the pause every operator has (`appliance jobs pause`).

A drain pauses the queued and waiting jobs first (so that nothing starts in a freed slot), then the running
ones, which checkpoint at the end of their current step (the supervisor's pause, as the stop chain does), and
waits until no job runs. The ids it paused are written to the install state before the service stops, so the
resume after the swap (or after a failed upgrade, by the next install or rollback) finds them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from appliance.bundle.box import InstallError
from appliance.durable import write_atomically
from appliance.service.client import Client, ClientError, DaemonUnreachable

ACTIVE = ("queued", "interrupted", "running")
DRAINED = "drained.json"


@dataclass(frozen=True)
class Drained:
    job_ids: tuple[str, ...]
    seconds: float
    still_running: tuple[str, ...]  # past the timeout: the service stop checkpoints them instead


def drain(socket: Path, timeout: float, state_dir: Path, say=print) -> Drained:
    start = time.monotonic()
    held: list[str] = []
    with Client(socket, timeout=60) as client:
        while True:
            jobs = client.jobs()
            waiting = [job for job in jobs if job.state in ("queued", "interrupted") and job.id not in held]
            running = [job for job in jobs if job.state == "running" and job.id not in held]
            for job in waiting + running:  # the queue first: a paused running job frees a slot
                try:
                    client.pause(job.id)
                    held.append(job.id)
                    say(f"  pausing {job.id} ({job.name}, {job.state}, step {job.step}/{job.steps_total})")
                except ClientError as error:
                    if error.status != 409:  # 409: it finished or changed state meanwhile
                        raise
            _record(state_dir, held)
            busy = [job.id for job in client.jobs() if job.state in ACTIVE]
            if not busy or time.monotonic() - start > timeout:
                return Drained(tuple(held), time.monotonic() - start, tuple(busy))
            time.sleep(0.5)


def resume(socket: Path, state_dir: Path, ready_timeout: float, say=print) -> list[str]:
    """Resume every job a drain paused, oldest first (the queue keeps submission order); forget the record."""
    held = pending(state_dir)
    if not held:
        return []
    deadline = time.monotonic() + ready_timeout
    resumed = []
    with Client(socket, timeout=60) as client:
        while True:  # the new daemon may still be loading
            try:
                client.status()
                break
            except DaemonUnreachable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        # In submission order (the queue's), not the drain's: the queue then reads as it did before.
        for job_id in [job.id for job in client.jobs() if job.id in held]:
            try:
                client.resume(job_id)
                resumed.append(job_id)
                say(f"  resumed {job_id}")
            except ClientError as error:
                if error.status not in (404, 409):  # gone, or resumed by someone already
                    raise
    (state_dir / DRAINED).unlink(missing_ok=True)
    return resumed


def pending(state_dir: Path) -> list[str]:
    """The ids a drain paused and no resume has taken back yet; a damaged record names itself and the way on."""
    path = state_dir / DRAINED
    try:
        held = json.loads(path.read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:
        held = error
    if isinstance(held, list) and all(isinstance(job_id, str) for job_id in held):
        return held
    raise InstallError(
        f"{path} (the jobs an upgrade paused) is damaged ({str(held)[:80]}): those jobs stay paused; find them with "
        f"'appliance jobs list', resume each with 'appliance jobs resume ID', then remove {path}"
    )


def _record(state_dir: Path, held: list[str]) -> None:
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    earlier = pending(state_dir)  # a drain that did not finish resuming: its jobs are kept
    # Durable before the service stops: a power loss then still leaves the list the resume needs.
    write_atomically(state_dir / DRAINED, json.dumps(earlier + [job_id for job_id in held if job_id not in earlier]))
