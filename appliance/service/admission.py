"""Submissions are checked off the daemon: a spooled body, a child process with rlimits, one at a time per caller.

What a submission costs is chosen by its caller (the file, the upload), so the
daemon itself never parses or validates one:
- the body is streamed to a file in the uploads folder as it arrives (never
  held whole in memory), up to the body limit;
- each check runs in a child process forked from a forkserver (the checking
  modules preloaded) under rlimits on memory, CPU time and file size, at a
  lower priority, and is killed past its wall-clock bound; whatever the input
  does to the child, the daemon answers 422;
- at most MAX_CHECKS run at once, on their own threads (so pause, resume,
  cancel and status never wait behind them), and at most one per caller: a
  second concurrent submission from the same caller is a 429; a body still
  arriving holds only its caller's turn, never one of the checks.
The child sends back plain data: the validated spec and plan, or the refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import resource
import sys
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

from appliance.errors import ApplianceError

MAX_CHECKS = 2  # submissions checked at once (each in its own child process)
QUEUE_SECONDS = 120.0  # how long a submission waits for a free check before a 503
# Callers whose bodies may arrive at once (each spooled to disk, at most the body limit): a slow sender holds its
# own turn only, so checks are never held by bodies still on their way.
MAX_ARRIVING = 16
CHECK_SECONDS = 60.0  # wall clock of one check; the child is killed past it
CHECK_CPU_SECONDS = 30  # RLIMIT_CPU of the child
CHECK_MEMORY_BYTES = 2 * 2**30  # RLIMIT_AS of the child (address space, imports included)
SPOOL_CHUNK_WRITES = 4  # threads that write spooled bodies
SPOOL_WRITE_BYTES = 1 << 20  # a spooled body is written a MiB at a time
# Imported once in the forkserver, so a check's child starts with them loaded (a check imports them lazily).
CHECK_MODULES = (
    "appliance.service.submission",
    "appliance.agents.environment_loader",
    "appliance.budget.device_plans",
    "appliance.budget.plan",
    "appliance.budget.shapes",
    "appliance.config.best",
    "appliance.judge.rubric",
    "appliance.models.store",
    "appliance.rewards.registry",
    "appliance.tasks.load",
)


class Busy(ApplianceError):
    """The caller already has a call of this kind in hand (429), no slot came free in time (503), the body is
    over its limit (413), or it could not be written (507)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.http_status = status


@dataclass(frozen=True)
class Verdict:
    """What a child's check found: `spec` and `plan` when accepted, else the refusal's status, message, errors."""

    status: int
    message: str = ""
    spec: dict | None = None
    plan: dict | None = None
    upload_dir: str | None = None
    errors: tuple[dict, ...] = ()
    dry_run: bool = False

    @property
    def accepted(self) -> bool:
        return self.spec is not None

    def refusal(self) -> ApplianceError:
        from appliance.config.job_file import ConfigError
        from appliance.service.submission import SubmissionRejected

        errors = [ConfigError(e["file"], e["key"], e["message"], e.get("line")) for e in self.errors]
        return SubmissionRejected(self.status, self.message, errors, self.plan)

    def discard(self) -> None:
        """Remove the upload of a job that will not be stored."""
        if self.upload_dir is not None:
            import shutil

            shutil.rmtree(self.upload_dir, ignore_errors=True)


class Turns:
    """At most one call at a time per caller, at most `arriving` callers at once, and of those at most `slots`
    doing their work at once: a body still arriving holds only its caller's turn, never a slot of the work."""

    def __init__(self, slots: int, what: str, arriving: int = MAX_ARRIVING) -> None:
        self.what, self.arriving = what, arriving
        self._busy: set[tuple] = set()
        self._slots = asyncio.Semaphore(slots)

    @contextlib.asynccontextmanager
    async def turn(self, caller: tuple) -> AsyncIterator[None]:
        """Hold the caller's one turn; Busy (429) when the caller holds one, (503) when `arriving` callers do."""
        if caller in self._busy:
            raise Busy(f"a {self.what} of yours is still being handled; wait for its answer, then send the next", 429)
        if len(self._busy) >= self.arriving:
            raise Busy(
                f"the daemon is taking {self.what}s from {len(self._busy)} callers at once; retry in a minute", 503
            )
        self._busy.add(caller)
        try:
            yield
        finally:
            self._busy.discard(caller)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """A free slot of the work (the body is in); Busy (503) when none comes free within QUEUE_SECONDS."""
        try:
            await asyncio.wait_for(self._slots.acquire(), QUEUE_SECONDS)
        except asyncio.TimeoutError:
            raise Busy(f"the daemon is busy with other callers' {self.what}s; retry in a minute", 503) from None
        try:
            yield
        finally:
            self._slots.release()

    async def read(self, chunks: AsyncIterator[bytes], max_bytes: int) -> bytes:
        """A whole request body of at most `max_bytes` (Busy(413) past it)."""
        parts, size = [], 0
        async for chunk in chunks:
            size += len(chunk)
            if size > max_bytes:
                raise Busy(f"the request body is over this daemon's limit of {max_bytes} bytes", 413)
            parts.append(chunk)
        return b"".join(parts)


class Admission:
    """The gate and the pool of checks of one daemon."""

    def __init__(self, policy, spool_dir: Path, max_checks: int = MAX_CHECKS) -> None:
        self.policy, self.spool_dir = policy, Path(spool_dir)
        self._turns = Turns(max_checks, "submission")
        self._threads = ThreadPoolExecutor(max_workers=max_checks + SPOOL_CHUNK_WRITES, thread_name_prefix="admission")
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(list(CHECK_MODULES))

    def warm(self) -> None:
        """Start the forkserver and let it import CHECK_MODULES now (one empty child), so the first submission
        does not wait for them. Called on the housekeeping thread: serving starts meanwhile."""
        child = self._context.Process(target=os.getpid, name="appliance-warm", daemon=True)
        child.start()
        child.join(60)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)

    def turn(self, caller: tuple):
        """The caller's one submission at a time, among MAX_ARRIVING (Turns.turn); its check takes a slot."""
        return self._turns.turn(caller)

    async def spool(self, chunks: AsyncIterator[bytes], max_bytes: int) -> Path:
        """The request body, written to a private file as it arrives; Busy(413) past `max_bytes`."""
        loop = asyncio.get_running_loop()
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        path = self.spool_dir / f".incoming-{uuid.uuid4().hex}"
        handle = None
        size = 0
        try:
            handle = await loop.run_in_executor(self._threads, _open_private, path)
            pending: list[bytes] = []
            pending_bytes = 0
            async for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise Busy(f"the request body is over this daemon's limit of {max_bytes} bytes", 413)
                pending.append(chunk)
                pending_bytes += len(chunk)
                if pending_bytes >= SPOOL_WRITE_BYTES:  # one thread hop per MiB, not per network read
                    await loop.run_in_executor(self._threads, handle.write, b"".join(pending))
                    pending, pending_bytes = [], 0
            await loop.run_in_executor(self._threads, _finish, handle, b"".join(pending))
        except OSError as error:  # the disk is full, or an I/O error: nothing was stored
            await loop.run_in_executor(self._threads, _close_and_remove, handle, path)
            raise Busy(
                f"the submission could not be written to {self.spool_dir} ({error.strerror or error}); nothing was "
                "submitted. Free space on its file system (or fix the I/O error) and retry",
                507,
            ) from error
        except BaseException:
            await loop.run_in_executor(self._threads, _close_and_remove, handle, path)
            raise
        return path

    async def check(self, body: Path, device) -> Verdict:
        """Run one check of the spooled `body` in a child process, in one of MAX_CHECKS slots (the caller holds a
        turn)."""
        loop = asyncio.get_running_loop()
        try:
            async with self._turns.slot():
                return await loop.run_in_executor(self._threads, self._run_child, body, device)
        finally:
            await loop.run_in_executor(self._threads, _remove, body)

    def _run_child(self, body: Path, device) -> Verdict:
        receive, send = self._context.Pipe(duplex=False)
        child = self._context.Process(
            target=_child_main, args=(str(body), self.policy, device, send), name="appliance-check", daemon=True
        )
        try:
            child.start()
        except OSError as error:  # fork refused (EAGAIN at the pids limit, ENOMEM)
            return Verdict(503, f"the daemon could not start a check ({error.strerror}); retry in a minute")
        send.close()
        try:
            if receive.poll(CHECK_SECONDS):
                return Verdict(**receive.recv())
            return Verdict(422, f"the job could not be checked within {CHECK_SECONDS:.0f} s; make it smaller")
        except (EOFError, OSError):
            return Verdict(
                422,
                "the job could not be checked within the daemon's bounds "
                f"({_ended(child)}; {CHECK_MEMORY_BYTES >> 20} MiB, {CHECK_CPU_SECONDS} s of CPU); make it smaller",
            )
        finally:
            receive.close()
            if child.is_alive():
                child.kill()
            child.join(5)
            if child.exitcode is not None:
                child.close()


def _ended(child) -> str:
    child.join(5)
    code = child.exitcode
    return "it was killed" if code is None or code < 0 else f"it exited with {code}"


def _finish(handle, tail: bytes) -> None:
    handle.write(tail)
    handle.close()


def _open_private(path: Path):
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")


def _close_and_remove(handle, path: Path) -> None:
    if handle is not None:
        with contextlib.suppress(OSError):
            handle.close()
    _remove(path)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


CHECK_NICENESS = 10  # a check is background work: the daemon's own answers come first


def _limit_child(policy) -> None:
    """The child's rlimits: address space, CPU seconds, and the largest file it may write (the upload); and
    a lower priority, so checks never starve the daemon's event loop of CPU."""
    os.nice(CHECK_NICENESS)
    resource.setrlimit(resource.RLIMIT_AS, (CHECK_MEMORY_BYTES, CHECK_MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (CHECK_CPU_SECONDS, CHECK_CPU_SECONDS + 5))
    largest = policy.max_upload_bytes + (1 << 20)
    resource.setrlimit(resource.RLIMIT_FSIZE, (largest, largest))


def _child_main(body: str, policy, device, send) -> None:
    """In the child: parse the spooled request, check it, send back a Verdict's fields."""
    try:
        _limit_child(policy)
        send.send(_verdict(Path(body), policy, device))
    except MemoryError:
        send.send(
            {"status": 422, "message": "the job needs more memory to check than the daemon allows; make it smaller"}
        )
    except BaseException as error:  # a bug in a check: the caller gets a 4xx, the daemon's log the traceback
        traceback.print_exception(error, file=sys.stderr)
        send.send(
            {"status": 422, "message": f"the job could not be checked ({type(error).__name__}); see the daemon's log"}
        )
    finally:
        send.close()


def _verdict(body: Path, policy, device) -> dict[str, Any]:
    from pydantic import ValidationError

    from appliance.service.api import SubmitRequest
    from appliance.service.submission import SubmissionRejected, check_submission

    try:
        request = SubmitRequest.model_validate_json(body.read_bytes())
    except ValidationError as error:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()))
        return {"status": 422, "message": f"bad request: {where + ': ' if where else ''}{first.get('msg', 'invalid')}"}
    dry_run = request.dry_run
    try:
        accepted = check_submission(request, policy, device)
    except SubmissionRejected as error:
        errors = tuple(item.as_dict() for item in error.errors)
        message = str(error).splitlines()[0]
        return {
            "status": error.http_status,
            "message": message,
            "errors": errors,
            "plan": error.plan,
            "dry_run": dry_run,
        }
    except ApplianceError as error:
        return {"status": error.http_status, "message": str(error).splitlines()[0], "dry_run": dry_run}
    upload = str(accepted.upload_dir) if accepted.upload_dir is not None else None
    spec = json.loads(accepted.spec.model_dump_json())
    return {"status": 200, "spec": spec, "plan": accepted.plan, "upload_dir": upload, "dry_run": dry_run}
