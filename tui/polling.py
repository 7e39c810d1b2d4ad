"""Pollers: a feed fetched on a Textual timer in a thread worker, its messages posted to the screen or app.

A Poller is a hidden widget: `set_interval` ticks, each tick starts the fetch
as a `@work(thread=True, exclusive=True)` worker unless one is still waiting
(a long-poll), and no exception a fetch raises ends the poller: it becomes a
message (DaemonUnreachable, ActionFailed, PollFailed) and the next try follows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Optional, Union

from textual import work
from textual.dom import DOMNode
from textual.message import Message
from textual.widget import Widget
from textual.worker import Worker, get_current_worker

from appliance.service.client import ClientError
from appliance.service.client import DaemonUnreachable
from tui import messages
from tui.feeds import RETRY_SECONDS

# Evaluated at import (a type alias, not an annotation): typing's spelling keeps CPython 3.9 working.
Fetch = Callable[[], Optional[Union[Message, Iterable[Message]]]]
# A feed paced by the daemon's events long-poll asks again this soon after its answer.
LONG_POLL_TICK = 0.1


def failure(group: str, error: Exception) -> tuple[Message, float]:
    """What to post for a fetch that raised, and how long to wait before the next try."""
    if isinstance(error, DaemonUnreachable):
        return messages.DaemonUnreachable(str(error)), RETRY_SECONDS
    if isinstance(error, ClientError):  # e.g. the job was removed: say so, keep polling
        return messages.ActionFailed(group, None, str(error)), RETRY_SECONDS
    # Anything else is a bug or an answer this client does not understand (another version).
    return messages.PollFailed(group, f"{type(error).__name__}: {error}"), RETRY_SECONDS


def _post(target: DOMNode, result: Message | Iterable[Message] | None) -> None:
    if result is None:
        return
    for message in [result] if isinstance(result, Message) else result:
        target.post_message(message)


class Poller(Widget):
    """Calls fetch() every `interval` seconds (0: again as soon as it answers) and posts what it returns."""

    DEFAULT_CSS = "Poller { display: none; }"

    def __init__(self, target: DOMNode, group: str, fetch: Fetch, interval: float) -> None:
        super().__init__(id=f"poller-{group}")
        self.target, self.group, self.fetch = target, group, fetch
        self.interval = interval
        self.busy = False
        self.next_try = 0.0  # monotonic time before which a tick does not fetch (after a failure)
        self.failed = False

    def on_mount(self) -> None:
        self.set_interval(max(self.interval, LONG_POLL_TICK), self.tick)
        self.tick()

    def tick(self) -> None:
        if self.busy or time.monotonic() < self.next_try:
            return
        self.busy = True
        self.fetch_once()

    @work(thread=True, exclusive=True, exit_on_error=False)
    def fetch_once(self) -> None:
        worker = get_current_worker()
        try:
            result = self.fetch()
        except Exception as error:  # noqa: BLE001 - a poller outlives every error, and says so
            message, wait = failure(self.group, error)
            self.target.post_message(message)
            self.failed, self.next_try = True, time.monotonic() + wait
        else:
            if not worker.is_cancelled:
                self.target.post_message(messages.DaemonReachable())
                if self.failed:
                    self.target.post_message(messages.PollRecovered(self.group))
                _post(self.target, result)
            self.failed = False
        self.busy = False


def poll(node: DOMNode, group: str, fetch: Fetch, interval: float) -> Poller:
    """Start polling fetch() for `node` (a screen or the app); it stops when the node goes away."""
    poller = Poller(node, group, fetch, interval)
    host = node if isinstance(node, Widget) else node.screen_stack[0]  # the app: its base screen
    host.mount(poller)
    return poller


def once(node: DOMNode, group: str, fetch: Fetch) -> Worker:
    """One call in a worker (actions, a tab's first load); every failure is posted like a poller's."""

    def call() -> None:
        try:
            result = fetch()
        except Exception as error:  # noqa: BLE001 - the app outlives every error, and says so
            node.post_message(failure(group, error)[0])
            return
        _post(node, result)

    return node.run_worker(call, name=group, group=group, thread=True, exclusive=True, exit_on_error=False)
