"""Experiment-tracker sinks for step records: TensorBoard event files and an offline W&B run.

Off by default (`tracking:` in the job file). `open_trackers(spec, job_dir, log)`
returns the sinks the job asks for; `write(record)` takes every StepRecord
(run_job hooks it into `on_step`), `close()` flushes them. Nothing here opens
a connection: TensorBoard writes files, W&B runs in offline mode and its
folder is uploaded later from a connected machine with `wandb sync`.

A sink whose package is not installed, or that fails, costs one log line and
is switched off; training goes on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from appliance.trackers.flatten import flatten_record

__all__ = ["Trackers", "flatten_record", "open_trackers"]

INSTALL_HINT = "pip install 'appliance[trackers]'"


class Trackers:
    """The open sinks of one run; each failure is logged once and turns that sink off."""

    def __init__(self, sinks: list, log: Callable[[str], None]):
        self.sinks = sinks
        self.log = log

    def write(self, record) -> None:
        values = flatten_record(record)
        for sink in list(self.sinks):
            try:
                sink.write(record.step, values)
            except Exception as error:  # a tracker must never stop training
                self._drop(sink, f"failed to write step {record.step}: {type(error).__name__}: {error}")

    def close(self) -> None:
        for sink in list(self.sinks):
            try:
                sink.close()
            except Exception as error:
                self._drop(sink, f"failed to close: {type(error).__name__}: {error}")
        self.sinks = []

    def _drop(self, sink, message: str) -> None:
        self.log(f"tracking.{sink.name}: {message}; this sink is off for the rest of the run")
        if sink in self.sinks:
            self.sinks.remove(sink)


def open_trackers(spec, job_dir: Path, log: Callable[[str], None]) -> Trackers:
    """The sinks `spec.tracking` turns on, for the run in `job_dir`; `log` gets one line per problem."""
    sinks = []
    tracking = spec.tracking
    wanted = [name for name, on in (("tensorboard", tracking.tensorboard), ("wandb", tracking.wandb)) if on]
    for name in wanted:
        try:
            if name == "tensorboard":
                from appliance.trackers.tensorboard_sink import TensorBoardSink

                sinks.append(TensorBoardSink(Path(job_dir) / "tensorboard"))
            else:
                from appliance.trackers.wandb_sink import WandbSink

                sinks.append(WandbSink(Path(job_dir), spec))
        except ImportError as error:
            log(
                f"tracking.{name} is on but the {error.name or name} package is not installed ({INSTALL_HINT}); "
                f"this run is not tracked in {name}"
            )
        except Exception as error:
            log(f"tracking.{name} could not start ({type(error).__name__}: {error}); this run is not tracked in {name}")
        else:
            log(f"tracking.{name}: writing to {sinks[-1].location}")
    return Trackers(sinks, log)
