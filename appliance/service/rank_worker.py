"""One rank of a daemon job that holds several slots (service/slots.py started it, as worker.py's module).

Rank 0 has the report channel and reports as a one-slot worker does; the
other ranks report nothing (rank 0's step records are the job's, gathered
over every rank). A stop request reaches rank 0 only, so every rank asks
rank 0 once per step, in the same collective: they all stop after the same
step and write its checkpoint together.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from appliance.service.worker import EXIT_BAD_JOB, EXIT_DISK_FULL, EXIT_DONE, Channel, _listen_for_stop


def agreed_stop(local: dict):
    """A stop callable every rank calls once per step: rank 0's pending reason, the same on every rank."""
    import torch.distributed as dist

    def stop_requested() -> str | None:
        box = [local.get("reason")]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    return stop_requested


def run_rank(channel: Channel | None, data_dir: Path, job_dir: Path, resume: bool) -> int:
    """Join the job's process group and run this rank of it; rank 0 reports over `channel`."""
    from appliance.config.load import parse_job_text
    from appliance.errors import ApplianceError, DiskFullError
    from appliance.grpo.distributed import destroy_process_group, init_process_group, launched_rank
    from appliance.grpo.run import run_job

    def send(message: dict) -> None:
        if channel is not None:
            channel.send(message)

    stop: dict = {}
    if channel is not None:
        threading.Thread(target=_listen_for_stop, args=(channel, stop), daemon=True, name="stop-listener").start()
    try:
        init_process_group(launched_rank())
        spec = parse_job_text((job_dir / "job.yaml").read_text(encoding="utf-8"), str(job_dir / "job.yaml"))
        result = run_job(
            spec,
            data_dir,
            job_dir,
            job_file_dir=job_dir,
            resume=resume,
            on_step=lambda record: send({"type": "step", "record": record.to_dict()}),
            on_event=lambda event: send({"type": "event", "event": event.to_dict()}),
            stop_requested=agreed_stop(stop),
        )
    except DiskFullError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        send({"type": "disk_full", "message": str(error)})
        return EXIT_DISK_FULL
    except ApplianceError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        send({"type": "error", "message": str(error)})
        return EXIT_BAD_JOB
    finally:
        destroy_process_group()
    send({"type": "result", "result": result.to_dict()})
    return EXIT_DONE
