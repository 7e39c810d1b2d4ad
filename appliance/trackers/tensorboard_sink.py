"""TensorBoard event files for a run, written with tensorboard's own summary writer (no torch, no network)."""

from __future__ import annotations

from pathlib import Path

from tensorboard.summary import Writer  # ImportError when tensorboard is not installed: the caller says so


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.location = folder
        self._writer = Writer(str(folder))

    def write(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, step=step)
        self._writer.flush()  # once a step: a TensorBoard watching the folder sees the step as soon as it ends

    def close(self) -> None:
        self._writer.close()
