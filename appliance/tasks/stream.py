"""The data cursor: batches of problems in a reproducible order that a checkpoint can resume exactly.

Each epoch is a fresh permutation seeded by (seed, epoch), so the order never
depends on how many batches were drawn before; the state is just
(epoch, position), and `load_state_dict` puts the cursor back so the next
batches are the ones an uninterrupted run would have drawn.
"""

from __future__ import annotations

import random
from typing import Sequence

from appliance.errors import CheckpointError, CheckpointMismatch
from appliance.tasks.task import Problem


class ProblemStream:
    def __init__(self, problems: Sequence[Problem], seed: int):
        if not problems:
            raise ValueError("ProblemStream needs at least one problem")
        self.problems = list(problems)
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        # A string seed is hashed with SHA-512 by random: stable across runs and Python processes.
        random.Random(f"problem-stream:{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self, n: int) -> list[Problem]:
        """The next n problems; a batch may run across the end of an epoch into the next."""
        if n < 1:
            raise ValueError(f"batch size must be at least 1, got {n}")
        batch = []
        while len(batch) < n:
            if self.position == len(self._order):  # an epoch ends mid-batch: the batch goes on into the next
                self.epoch += 1
                self.position = 0
                self._order = self._epoch_order(self.epoch)
            batch.append(self.problems[self._order[self.position]])
            self.position += 1
        return batch

    def state_dict(self) -> dict:
        """JSON-serialisable cursor; `num_problems` and `seed` guard against resuming on other data."""
        return {"epoch": self.epoch, "position": self.position, "num_problems": len(self.problems), "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        for key, expected in (("num_problems", len(self.problems)), ("seed", self.seed)):
            # Another dataset or seed would replay other problems under the same cursor: refused, not resumed.
            if key in state and state[key] != expected:
                raise CheckpointMismatch(
                    f"the checkpoint's data cursor was saved with {key}={state[key]}, but this run has {key}={expected}"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= len(self.problems):
            raise CheckpointError(f"the checkpoint's data cursor is out of range: epoch={epoch}, position={position}")
        self.epoch, self.position = epoch, position
        self._order = self._epoch_order(epoch)
