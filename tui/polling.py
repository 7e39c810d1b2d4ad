"""Pollers: a feed called again and again in a Textual thread worker, its messages posted to a node.

One worker per poller group (`exclusive=True` replaces an older one), errors
never end the app (`exit_on_error=False`), and an unreachable daemon is
reported once per try and retried every RETRY_SECONDS until it answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from textual.dom import DOMNode
from textual.message import Message
from textual.worker import Worker, get_current_worker

from appliance.service.client import ClientError
from appliance.service.client import DaemonUnreachable as Unreachable
from tui import messages as m
from tui.feeds import RETRY_SECONDS

Fetch = Callable[[], Message | Iterable[Message] | None]


def _post(node: DOMNode, result: Message | Iterable[Message] | None) -> None:
    if result is None:
        return
    for message in [result] if isinstance(result, Message) else result:
        node.post_message(message)


def _sleep(worker: Worker, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not worker.is_cancelled and time.monotonic() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def poll(node: DOMNode, group: str, fetch: Fetch, interval: float) -> Worker:
    """Call fetch() every `interval` seconds until the node goes away; post what it returns to the node."""

    def loop() -> None:
        worker = get_current_worker()
        while not worker.is_cancelled:
            try:
                result = fetch()
            except Unreachable as error:
                node.post_message(m.DaemonUnreachable(str(error)))
                _sleep(worker, RETRY_SECONDS)
                continue
            except ClientError as error:  # e.g. the job was removed: say so, keep polling
                node.post_message(m.ActionFailed(group, None, str(error)))
                _sleep(worker, max(interval, RETRY_SECONDS))
                continue
            if worker.is_cancelled:
                return
            node.post_message(m.DaemonReachable())
            _post(node, result)
            _sleep(worker, interval)

    return node.run_worker(loop, name=group, group=group, thread=True, exclusive=True, exit_on_error=False)


def once(node: DOMNode, group: str, fetch: Fetch) -> Worker:
    """One call in a worker (actions, a tab's first load); an unreachable daemon is reported like a poller's."""

    def call() -> None:
        try:
            result = fetch()
        except Unreachable as error:
            node.post_message(m.DaemonUnreachable(str(error)))
            return
        except ClientError as error:
            node.post_message(m.ActionFailed(group, None, str(error)))
            return
        _post(node, result)

    return node.run_worker(call, name=group, group=group, thread=True, exclusive=True, exit_on_error=False)
