"""The project's one base exception: every error the appliance raises on purpose derives from it.

The CLI turns an ApplianceError into one sentence on stderr and an exit code;
the daemon's control API turns it into an HTTP error. Anything else that
escapes is a bug (or an engine failure) and keeps its traceback in the log.
"""

from __future__ import annotations


class ApplianceError(Exception):
    """A failure the user can act on; the message says what to change.

    Each kind says how it ends a command and an API request: `exit_code` (the
    CLI's: 2 is input to correct, 1 a run that failed) and `http_status` (the
    control API's). Subclasses override them; nothing maps types to codes.
    """

    exit_code = 2
    http_status = 400


class UsageError(ApplianceError):
    """A command-line option the command cannot use; the message names the option and a valid example."""


class DiskFullError(ApplianceError):
    """A checkpoint could not be written for lack of disk space; the previous checkpoint is intact."""

    exit_code = 1

    def __init__(self, folder, needed_bytes: int | None, free_bytes: int | None):
        self.folder, self.needed_bytes, self.free_bytes = folder, needed_bytes, free_bytes
        needed = f"about {needed_bytes:,} bytes" if needed_bytes else "more space"
        free = f"{free_bytes:,} bytes are free" if free_bytes is not None else "the disk is full"
        super().__init__(
            f"not enough disk space to write a checkpoint in {folder}: it needs {needed} and {free}; "
            "free some space (or lower checkpoint.keep_last) and resume the job"
        )


class CheckpointError(ApplianceError):
    """A checkpoint cannot be read or resumed; the message names it and the way on (often --restart)."""


class CheckpointMismatch(CheckpointError):
    """A checkpoint saved by a run over other data: no checkpoint of it can be resumed by this run."""


class JobStopped(ApplianceError):
    """A run ended early on purpose (e.g. too many non-finite steps in a row)."""

    exit_code = 1


class StopBeforeStep(ApplianceError):
    """The job was asked to stop while a step waited for its input; nothing of that step was applied."""


class ExportError(ApplianceError):
    """The export cannot be made, or an exported folder does not match its manifest; the message names the job,
    checkpoint or file and what to do."""
