"""A Weights & Biases run in offline mode: a folder under the job that `wandb sync` uploads later.

Offline mode is forced (whatever WANDB_MODE says) and everything that could
look outward is off: no git, code, stats or machine probing, no console
capture. The run is named after the job and carries the job spec as config.
"""

from __future__ import annotations

import os
from pathlib import Path

import wandb  # ImportError when wandb is not installed: the caller says so


class WandbSink:
    name = "wandb"

    def __init__(self, job_dir: Path, spec):
        os.environ["WANDB_MODE"] = "offline"  # also for anything wandb starts (its core service)
        settings = wandb.Settings(
            mode="offline",
            silent=True,
            console="off",
            disable_git=True,
            save_code=False,
            x_disable_stats=True,
            x_disable_meta=True,
            x_disable_machine_info=True,
        )
        self._run = wandb.init(
            dir=str(job_dir),
            project=spec.tracking.wandb_project,
            name=spec.name,
            config=spec.model_dump(mode="json"),
            settings=settings,
            reinit="create_new",  # a run per job, also when one process trains several (the tests, a bench)
        )
        self.location = Path(self._run.dir).parent  # <job dir>/wandb/offline-run-.../

    def write(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def close(self) -> None:
        self._run.finish()
