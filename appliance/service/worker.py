"""The worker: one job in its own process (and process group), reporting to the daemon as it goes.

    python -m appliance.service.worker --fd N --data-dir D --job-dir J [--resume]

The daemon starts it with a connected Unix stream socket as fd N and the
job's log.txt as stdout and stderr. Only plain data crosses, one JSON object
per line:

    worker -> daemon  {"type": "step", "record": StepRecord.to_dict()}
                      {"type": "event", "event": RunEvent.to_dict()}
                      {"type": "result", "result": RunResult.to_dict()}
                      {"type": "disk_full", "message": ...}   (then exit EXIT_DISK_FULL)
                      {"type": "error", "message": ...}       (then exit EXIT_BAD_JOB: not worth a restart)
    daemon -> worker  {"type": "stop", "reason": "pause" | "shutdown"}

A stop request is polled by run_job between steps, which then checkpoints and
returns. When the daemon goes away (the socket closes) the worker stops as on
"shutdown": the checkpoint it leaves is where the next daemon resumes.
"""

from __future__ import annotations

import appliance.offline  # noqa: F401  (before any ML import)

import argparse
import json
import os
import socket
import sys
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

MODULE = "appliance.service.worker"
EXIT_DONE, EXIT_CRASH, EXIT_BAD_JOB, EXIT_DISK_FULL = 0, 1, 2, 3
# The longest report line the daemon reads; a longer one is skipped (a job cannot size the daemon's memory).
MAX_MESSAGE_CHARS = 4 * 2**20


class Channel:
    """JSON lines over a stream socket; `send` is thread-safe, `messages` yields until the peer closes."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._lock = threading.Lock()
        self._reader = sock.makefile("r", encoding="utf-8")

    def send(self, message: dict) -> bool:
        data = (json.dumps(message, default=float) + "\n").encode()  # default=float: numpy and torch scalars
        with self._lock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                return False  # the peer is gone; the caller finds out from its own loop

    def messages(self):
        """Each report as it arrives; a line over MAX_MESSAGE_CHARS or not JSON is skipped."""
        try:
            while line := self._reader.readline(MAX_MESSAGE_CHARS + 1):
                if len(line) > MAX_MESSAGE_CHARS:
                    while line and not line.endswith("\n"):  # the rest of it, a chunk at a time
                        line = self._reader.readline(MAX_MESSAGE_CHARS)
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:  # a line cut by the peer's death: the next ones still count
                    continue
        except (OSError, ValueError):
            return

    def release(self) -> None:
        """Drop this process's copy of a channel another process (rank 0) keeps: no shutdown, which would end
        the connection for both."""
        for closing in (self._reader.close, self.sock.close):
            try:
                closing()
            except OSError:
                pass

    def close(self) -> None:
        # shutdown() first: it wakes a thread blocked reading, which holds the reader's lock that close() needs.
        for closing in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self._reader.close, self.sock.close):
            try:
                closing()
            except OSError:
                pass


def _listen_for_stop(channel: Channel, stop: dict) -> None:
    for message in channel.messages():
        if message.get("type") == "stop":
            # The first reason stands: a shutdown after a pause does not turn the pause into an interruption.
            stop.setdefault("reason", message.get("reason") or "shutdown")
    stop.setdefault("reason", "shutdown")  # the daemon is gone


def local_stop(stop: dict) -> Callable[[], str | None]:
    """The stop callable of a one-slot job: the reason the daemon sent, if any."""
    return lambda: stop.get("reason")


def run(channel: Channel | None, data_dir: Path, job_dir: Path, resume: bool, world) -> int:
    """Run the job (or this rank of it), reporting over `channel` (None: a rank after 0 reports nothing).

    A rank of several asks rank 0 for the daemon's stop requests once per step, inside the job's process group
    (service/rank_worker.py); a one-slot job reads them itself."""
    from appliance.config.job_file import parse_job_text
    from appliance.errors import ApplianceError, DiskFullError
    from appliance.grpo.run import run_job
    from appliance.service.rank_worker import agreed_stop, rank_process_group
    from appliance.tasks.jsonl import read_admitted_paths_only

    read_admitted_paths_only()  # the job's dataset is the resolved path admission checked: no link is followed
    several = world.world_size > 1
    stop_policy = agreed_stop if several else local_stop
    around = (lambda: rank_process_group(world)) if several else nullcontext

    def send(message: dict) -> None:
        if channel is not None:
            channel.send(message)

    stop: dict = {}
    if channel is not None:
        threading.Thread(target=_listen_for_stop, args=(channel, stop), daemon=True, name="stop-listener").start()
    try:
        with around():
            spec = parse_job_text((job_dir / "job.yaml").read_text(encoding="utf-8"), str(job_dir / "job.yaml"))
            result = run_job(
                spec,
                data_dir,
                job_dir,
                job_file_dir=job_dir,
                world=world,
                resume=resume,
                on_step=lambda record: send({"type": "step", "record": record.to_dict()}),
                on_event=lambda event: send({"type": "event", "event": event.to_dict()}),
                stop_requested=stop_policy(stop),
            )
    except DiskFullError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        send({"type": "disk_full", "message": str(error)})
        return EXIT_DISK_FULL
    except ApplianceError as error:  # the job itself is wrong: restarting would fail the same way
        print(f"error: {error}", file=sys.stderr, flush=True)
        send({"type": "error", "message": str(error)})
        return EXIT_BAD_JOB
    send({"type": "result", "result": result.to_dict()})
    return EXIT_DONE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=MODULE, description="one appliance job (started by the daemon)")
    parser.add_argument("--fd", type=int, required=True, help="the daemon's end of the report channel")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--job-dir", type=Path, required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    from appliance.config.job_file import parse_job_text
    from appliance.grpo.distributed import LAUNCHER, process_role

    frozen = args.job_dir / "job.yaml"
    spec = parse_job_text(frozen.read_text(encoding="utf-8"), str(frozen))
    channel = Channel(socket.socket(fileno=args.fd))
    try:
        # The daemon made the job's slots visible; this process places the job on them, or launches its ranks.
        world = process_role(spec.resources)
        if world != LAUNCHER:
            return run(channel, args.data_dir, args.job_dir, args.resume, world)
        return launch(spec, channel, args.data_dir, args.job_dir, args.resume)
    finally:
        channel.close()


def launch(spec, channel: Channel, data_dir: Path, job_dir: Path, resume: bool) -> int:
    """Start the job's ranks on this box through the launcher `appliance train` uses (ranks.launch_ranks) and
    end as rank 0 ended: its code says whether the job is worth a restart."""
    from appliance.ranks import LaunchError, Topology, launch_logs, launch_ranks

    shape = Topology(1, None, None, spec.resources.student_devices)
    try:
        launch_ranks(spec.name, shape, rank_entry, (channel, data_dir, job_dir, resume), launch_logs(job_dir))
    except LaunchError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        # The first rank that ended with a code of its own (a bad job, a full disk) says what the job needs.
        return next((code for _, code in sorted(error.exit_codes.items()) if code > 0), EXIT_CRASH)
    return EXIT_DONE


def rank_entry(channel: Channel, data_dir: Path, job_dir: Path, resume: bool) -> None:
    """One rank of a several-slot job, forked by the launcher: rank 0 reports over the channel it inherited,
    the others write their output to log.rank<R>.txt and report nothing."""
    from appliance.config.job_file import parse_job_text
    from appliance.grpo.distributed import process_role

    frozen = job_dir / "job.yaml"
    world = process_role(parse_job_text(frozen.read_text(encoding="utf-8"), str(frozen)).resources)
    if not world.is_main:
        with open(job_dir / f"log.rank{world.rank}.txt", "ab") as log:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
                os.dup2(log.fileno(), stream.fileno())
        channel.release()  # this rank's copy: rank 0's stays open
    code = run(channel if world.is_main else None, data_dir, job_dir, resume, world)
    if code != EXIT_DONE:
        raise SystemExit(code)  # the launcher ends the other ranks


if __name__ == "__main__":
    sys.exit(main())
