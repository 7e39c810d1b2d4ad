"""The foreground terminal of `appliance train`: our lines and one progress bar; library chatter to log.txt.

Libraries write to the process's file descriptors 1 and 2 from Python
(transformers' weight-loading bars, bitsandbytes and vLLM warnings) and from
C or child processes (vLLM's engine core). So, unless --verbose, both
descriptors are pointed at the job's log.txt for the run, and our own lines
go to a saved copy of the terminal (and to log.txt too). A rich progress bar
with the ETA sits below the per-step lines when stdout is a terminal.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


class Terminal:
    def __init__(self, log_path: Path, *, verbose: bool, steps: int):
        self.log_path = Path(log_path)
        self.verbose = verbose
        self.steps = steps
        self.steps_seen = 0
        self.last_step = 0
        self._saved: dict[int, int] = {}
        self._out = None
        self._progress = None
        self._task = None

    # ----- context ------------------------------------------------------------------------------

    def __enter__(self) -> "Terminal":
        from rich.console import Console

        # Flushed before the descriptors move: what Python buffered so far belongs to the terminal.
        sys.stdout.flush()
        sys.stderr.flush()
        terminal_fd = os.dup(1)  # a copy of the terminal that survives fd 1 pointing at log.txt
        self._out = os.fdopen(terminal_fd, "w", buffering=1, encoding="utf-8", errors="replace")
        if not self.verbose:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            # dup2 on the descriptors themselves, not sys.stdout: C code and child processes write there too.
            for fd in (1, 2):
                self._saved[fd] = os.dup(fd)
                os.dup2(log_fd, fd)
            os.close(log_fd)
        console = Console(file=self._out, highlight=False)
        if console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]training"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=console,
                transient=True,
                # a step takes minutes: estimate the speed over hours, not over rich's default window of seconds
                speed_estimate_period=6 * 3600,
                # rich would route sys.stdout/stderr (the libraries) to the terminal
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=self.steps)
        self._console = console
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        self._saved.clear()
        if self._out is not None:
            self._out.close()
            self._out = None

    # ----- output -------------------------------------------------------------------------------

    def line(self, text: str, to_log: bool = False) -> None:
        """A line for the person at the terminal (run_job's log lines are in log.txt already)."""
        if self._out is None:
            print(text, flush=True)
            return
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            self._out.write(text + "\n")
            self._out.flush()
        if to_log:
            with open(self.log_path, "a", encoding="utf-8") as handle:
                handle.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")

    def step(self, text: str, step: int) -> None:
        self.steps_seen += 1
        self.last_step = step
        self.line(text, to_log=True)
        if self._progress is not None:
            self._progress.update(self._task, completed=step)
