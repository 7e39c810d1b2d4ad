"""How fast one caller may change things: a token bucket per caller for the calls the audit log records in full.

A successful pause, resume, cancel, delete, export, endpoint hand-out or trajectory submission is written to
the audit log in full and fsynced (it is the trail), and most append a job event: without a bound, one member's
pause/resume loop on their own job wrote 250 lines a second and rotated the whole history out in under an hour.
Each caller (a uid, or a TCP network) may make BURST such calls at once, then PER_SECOND a second; past that the
call is refused with a 429 saying when to retry (a refusal is chatter: counted, not written in full).
Submissions are bounded by their own turn and the per-user caps (fair_share.py), not here.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable, Hashable

from appliance.errors import ApplianceError

BURST = 300  # calls a caller may make at once (a user cancelling a screenful of marked jobs)
PER_SECOND = 1.0  # then this many a second
MAX_CALLERS = 4096  # buckets kept; the least recently used is dropped past that (it was full again anyway)


class TooManyCalls(ApplianceError):
    """The caller made more changes than its rate allows; the message says when to retry."""

    http_status = 429


class CallRate:
    """A token bucket per caller: `charge(caller)` takes one call or raises TooManyCalls."""

    def __init__(
        self, burst: int = BURST, per_second: float = PER_SECOND, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst, self.per_second, self.clock = burst, per_second, clock
        self._buckets: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()  # caller -> (calls left, when)
        self._lock = threading.Lock()

    def charge(self, caller: Hashable) -> None:
        with self._lock:
            now = self.clock()
            left, then = self._buckets.pop(caller, (float(self.burst), now))
            left = min(float(self.burst), left + (now - then) * self.per_second)
            if left < 1.0:
                self._buckets[caller] = (left, now)
                wait = (1.0 - left) / self.per_second
                raise TooManyCalls(
                    f"more than {self.burst} changes at once or {self.per_second:g} a second from this caller; "
                    f"retry in {max(1, round(wait))} s"
                )
            self._buckets[caller] = (left - 1.0, now)
            while len(self._buckets) > MAX_CALLERS:
                self._buckets.popitem(last=False)
