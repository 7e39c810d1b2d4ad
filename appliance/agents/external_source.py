"""External rollouts: the student endpoint a job serves, and the source of the trajectory groups agents submit.

A job with `task.environment: external` does not play rollouts itself. Its
worker serves the student with its current adapter on an OpenAI-compatible
`/v1/chat/completions` (loopback unless the daemon's `--agent-endpoint-addr` says
otherwise, agents/endpoint_bind.py; a per-job bearer token in `<job>/endpoint.json`,
handed out by `GET /jobs/{id}/endpoint`). Agents submit trajectory groups to
it; the served-token ledger (agents/served_tokens.py) checks them and the accepted
ones queue for `collect`.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import secrets
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from pydantic import TypeAdapter, ValidationError

from appliance.agents.endpoint_bind import LOOPBACK_ANY_PORT, EndpointBind, EndpointBindError
from appliance.agents.endpoint_file import ENDPOINT_FILE, SUBMIT_ROUTE, previous_endpoint, write_endpoint
from appliance.agents.served_tokens import (
    DEFAULT_CAPACITY,
    Freshness,
    ServedLedger,
    TrajectoryRefused,
    trained_turn_keys,
)
from appliance.agents.spool import GroupSpool, Spooled
from appliance.agents.toolcalls import parse_tool_calls, template_messages
from appliance.agents.trajectory import Message, TrajectoryGroup
from appliance.engines.engine import LocalEngine
from appliance.engines.openai_server import ChatService, SamplingPolicy, build_app, serve_app_in_thread
from appliance.errors import ApplianceError, StopBeforeStep
from appliance.paths import served_ledger_file, submitted_groups_dir

log = logging.getLogger(__name__)

_MESSAGE = TypeAdapter(Message)
_MESSAGE_FIELDS = {
    "system": ("role", "content"),
    "user": ("role", "content"),
    "assistant": ("role", "content", "tool_calls"),
    "tool": ("role", "content", "tool_call_id"),
}


def new_endpoint_token() -> str:
    """A bearer token for a job's chat endpoint: 64 hex digits. Never a leading '-', which `--token VALUE` on an
    agent's command line would read as an option (token_urlsafe gave one token in 64 that did)."""
    return secrets.token_hex(32)


class CollectStopped(StopBeforeStep):
    """The job was asked to stop while it waited for submitted trajectory groups."""


class NoTrajectories(ApplianceError):
    """No trajectory group arrived for the daemon's idle time: the job ends (it would hold its device for ever)."""

    exit_code = 1


def request_messages(messages: list[dict]) -> list[Message]:
    """OpenAI chat messages (as a client sends them) as typed trajectory messages; fields we do not use dropped."""
    typed = []
    for index, message in enumerate(messages):
        kept = {key: value for key, value in message.items() if key in _MESSAGE_FIELDS.get(message.get("role"), ())}
        if kept.get("content") is None:
            kept["content"] = ""
        try:
            typed.append(_MESSAGE.validate_python(kept))
        except ValidationError as error:
            first = error.errors()[0]
            at = ".".join(str(part) for part in first.get("loc", ()))
            raise ValueError(f"messages.{index}{'.' + at if at else ''}: {first.get('msg')}") from None
        for number, call in enumerate(getattr(typed[-1], "tool_calls", [])):
            try:
                call.function.parsed_arguments()
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"messages.{index}.tool_calls.{number}.function.arguments is not JSON ({error.msg});"
                    " send the arguments as the JSON text of an object, as the endpoint returned them"
                ) from None
    return typed


class EndpointHooks:
    """The ChatHooks of an external job's endpoint: tools in the prompt, tool calls out, every reply in the ledger.

    Tools are described in the prompt exactly as in-process rollouts do (`toolcalls.template_messages`); replies
    carry the parsed calls as OpenAI `tool_calls` while `content` keeps the model's whole text, call markup
    included, so sending the message back renders the very tokens the model wrote.
    """

    def __init__(self, source: "ExternalSource"):
        self.source = source

    def template(self, messages: list[dict], tools: list[dict]) -> list[dict[str, str]]:
        return template_messages(request_messages(messages), tools)

    def reply(self, prompt_ids: list[int], completion, call_id_prefix: str) -> dict[str, Any]:
        policy = self.source.service.policy
        sampling = {"temperature": policy.temperature, "top_p": policy.top_p} if policy is not None else None
        self.source.ledger.record(
            prompt_ids,
            completion.token_ids,
            completion.text,
            completion.logprobs,
            self.source.step,
            sampling,
            completion.finish_reason,
        )
        calls = parse_tool_calls(completion.text, call_id_prefix=call_id_prefix).calls
        if not calls:
            return {}
        # A turn cut at max_tokens says so even when the calls before the cut were whole.
        reason = "length" if completion.finish_reason == "length" else "tool_calls"
        return {"message": {"tool_calls": [call.model_dump() for call in calls]}, "finish_reason": reason}

    def routes(self, app) -> None:
        from fastapi import Body
        from fastapi.responses import JSONResponse

        source = self.source

        @app.post(SUBMIT_ROUTE)
        def submit(body: dict = Body(...)):  # noqa: B008  (FastAPI's way of declaring a body)
            groups = body.get("groups")
            if not isinstance(groups, list) or not groups:
                return _error(422, '"groups" must be a non-empty list of trajectory groups')
            try:
                return source.submit(groups)
            except TrajectoryRefused as error:
                return _error(422, str(error))
            except SourceBusy as error:
                return _error(error.status, str(error))

        def _error(status: int, message: str) -> JSONResponse:
            return JSONResponse(
                {"error": {"message": message, "type": "invalid_request_error", "code": status}}, status_code=status
            )


class SourceBusy(ApplianceError):
    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class ExternalSource:
    """A TrajectorySource fed by agents outside the job, through the student endpoint it serves.

    Nothing accepted is lost when the worker restarts: a submission is answered "accepted" only once its groups
    are on disk (agents/spool.py), and they leave the disk only once the step that trained them is checkpointed.
    The ledger (agents/served_tokens_file.py), the token and, when free, the port (agents/endpoint_file.py) outlive a
    restart too, so completions served before it can still be submitted and forged or reused ones are refused.
    """

    def __init__(
        self,
        engine: LocalEngine,
        job_dir: Path,
        group_size: int,
        *,
        served_name: str,
        max_queued_groups: int = 64,
        ledger_capacity: int = DEFAULT_CAPACITY,
        stop_requested: Callable[[], str | None] | None = None,
        bind: EndpointBind = LOOPBACK_ANY_PORT,
        policy: SamplingPolicy | None = None,
        max_staleness: int = 1,
        idle_seconds: float | None = None,
    ):
        job_dir = Path(job_dir)
        # With no group for this long the job ends with a reason (the daemon's --external-idle-timeout).
        self.idle_seconds = idle_seconds or None
        self._last_arrival = time.monotonic()
        self.group_size, self.max_queued_groups = group_size, max_queued_groups
        self.max_staleness = max_staleness
        self.stop_requested = stop_requested or (lambda: None)
        self.ledger = ServedLedger(ledger_capacity, served_ledger_file(job_dir))
        self.spool = GroupSpool(submitted_groups_dir(job_dir))
        self._queue: deque[Spooled] = deque(self.spool.load())
        # A crash can fall between writing a group and recording its turns as used: the spool is the truth.
        self.ledger.mark_used_at_least(trained_turn_keys([entry.group for entry in self._queue]))
        if self._queue:
            log.warning(
                "%s: %d submitted trajectory groups from before the restart are queued again", job_dir, len(self._queue)
            )
        self.step = 0
        self.accepted_total = 0
        self.stale_dropped = 0
        self._arrived = threading.Condition()
        # Logprobs: those sampled; under `policy` every request is sampled as the job samples. Served through the
        # trainer's own engine (not vLLM's OpenAI server, which would bypass the gate and the ledger), so the
        # ledger records that engine's token ids and each sync's adapter serves the next collect.
        self.service = ChatService(engine, served_name, hooks=EndpointHooks(self), policy=policy)
        # Submissions are checked while the trainer updates: with a tokenizer of their own (a fast tokenizer
        # shared between threads can fail with "Already borrowed" when the engine pads a batch meanwhile).
        self._tokenizer = copy.deepcopy(engine.tokenizer)
        self._submit_lock = threading.Lock()
        self._open_for_submissions = True
        self._closed = False
        # The trainer and the endpoint never use the model at once: the trainer holds the engine lock from the
        # end of one collect to the start of the next (update and sync); chat requests arriving then wait.
        self.service.lock.acquire()  # closed until the trainer's first collect
        self._gate_held = True
        self._open_endpoint(job_dir, bind)

    def _open_endpoint(self, job_dir: Path, bind: EndpointBind) -> None:
        """Serve the chat service (on the previous run's token and, when free, port) and write endpoint.json."""
        previous = previous_endpoint(job_dir)
        self.token = previous.token or new_endpoint_token()
        self.server = _serve(build_app(self.service, self.token), bind, previous.port)
        port = urlsplit(self.server.url).port
        self.url, self.local_url = bind.client_url(port), bind.local_url(port)
        self.endpoint_file = job_dir / ENDPOINT_FILE
        write_endpoint(
            job_dir,
            {
                "url": self.url,
                "local_url": self.local_url,
                "token": self.token,
                "model": self.service.served_name,
                "pid": os.getpid(),
            },
        )

    # ----- the trainer's side ----------------------------------------------------------------------

    def collect(self, step: int, scenarios: int, group_size: int) -> list[TrajectoryGroup]:
        """The next `scenarios` submitted groups; serves the endpoint until they are there."""
        if group_size != self.group_size:
            raise ValueError(f"this source checks groups of {self.group_size}, not {group_size}")
        self.step = step
        self._open()
        opened = time.monotonic()  # agents can submit only from here: the idle time counts from the later of the two
        try:
            with self._arrived:
                self._discard_trained_before(step)
                self._drop_stale(step)
                while len(self._queue) < scenarios:
                    reason = "the source was closed" if self._closed else self.stop_requested()
                    if reason:
                        raise CollectStopped(
                            f"stopped ({reason}) while waiting for {scenarios} trajectory groups"
                            f" ({len(self._queue)} submitted)"
                        )
                    if self.idle_seconds and time.monotonic() - max(self._last_arrival, opened) > self.idle_seconds:
                        raise NoTrajectories(
                            f"no trajectory group arrived for {self.idle_seconds:g} s (the daemon's external idle "
                            f"time) while step {step} waited for {scenarios}; the job ends here, its checkpoints "
                            "kept: submit it again when its agents are ready"
                        )
                    self._arrived.wait(0.5)  # woken by a submission, else often enough to see a stop request
                taken = [self._queue.popleft() for _ in range(scenarios)]
                self.spool.take(taken, step)
                return [entry.group for entry in taken]

        finally:
            self._close_gate()

    def _drop_stale(self, step: int) -> None:
        """Queued groups that grew older than `max_staleness` while they waited are dropped, with the reason."""
        stale = [entry for entry in self._queue if _served_step(entry.group) < step - self.max_staleness]
        if not stale:
            return
        self._queue = deque(entry for entry in self._queue if entry not in stale)
        self.spool.take(stale, step)  # deleted with the step's checkpoint, never trained
        self.stale_dropped += len(stale)
        log.warning(
            "step %d: %d queued trajectory groups were served more than task.max_staleness = %d steps earlier"
            " (an older policy sampled them) and are dropped: %s",
            step,
            len(stale),
            self.max_staleness,
            ", ".join(f"{entry.group.scenario_id!r} (served at step {_served_step(entry.group)})" for entry in stale),
        )

    @property
    def queued(self) -> int:
        """Accepted groups no step has taken yet (after a restart: also those taken by steps being replayed)."""
        with self._arrived:
            return len(self._queue)

    def checkpointed(self, step: int) -> None:
        """Step `step` is in a complete checkpoint: the groups it and the steps before it trained are deleted."""
        with self._arrived:
            self.spool.drop_trained(step)

    def close(self) -> None:
        # The token and the last address stay (no url: not serving), for the next worker of this job.
        write_endpoint(
            self.endpoint_file.parent, {"token": self.token, "model": self.service.served_name, "last_url": self.url}
        )
        with self._submit_lock:
            self._open_for_submissions = False
        with self._arrived:
            self._closed = True
            self._arrived.notify_all()
        self.service.open = False  # requests waiting for the engine are answered 503, not generated
        self._open()  # let the waiting requests reach that answer instead of hanging on the gate
        self.server.close(timeout_seconds=60)
        self.ledger.close()

    # ----- the endpoint's side ----------------------------------------------------------------------

    def submit(self, raw_groups: list[Any]) -> dict[str, int]:
        """Verify and queue submitted groups (all or none); on disk before it answers. The endpoint's submit route."""
        with self._submit_lock:
            if not self._open_for_submissions:
                raise SourceBusy("the job is ending; it takes no more trajectories", 409)
            with self._arrived:
                room = self.max_queued_groups - len(self._queue)
            if len(raw_groups) > room:
                raise SourceBusy(
                    f"{len(raw_groups)} groups do not fit: {room} of {self.max_queued_groups} queue"
                    " places are free; submit again after the next step",
                    429,
                )
            # Accepted now, trained at the next collect's step at the earliest.
            freshness = Freshness(self.step + 1, self.max_staleness)
            groups, keys = self.ledger.check(raw_groups, self.group_size, self._tokenizer, freshness)
            # On disk first, marked used after: a crash between the two is mended at restart from the spool
            # (__init__), while the other order could lose an accepted group whose turns count as used.
            with self._arrived:
                entries = self.spool.add(groups)
            self.ledger.mark_used(keys)
        dropped = sum(t.metadata.get("unserved_messages_dropped", 0) for group in groups for t in group.trajectories)
        if dropped:
            log.warning(
                "%d messages after the last served turn of their trajectories were left out (not trained, not read"
                " by rules or the judge)",
                dropped,
            )
        with self._arrived:
            self._queue.extend(entries)
            self.accepted_total += len(groups)
            self._last_arrival = time.monotonic()
            self._arrived.notify_all()
            return {
                "accepted": len(groups),
                "queued": len(self._queue),
                "step": self.step,
                "unserved_messages_dropped": dropped,
            }

    def _discard_trained_before(self, step: int) -> None:
        if any(entry.taken_by is not None for entry in self._queue):  # only groups queued again after a restart
            self._queue = deque(self.spool.without_trained(list(self._queue), step))

    def _open(self) -> None:
        if self._gate_held:
            self._gate_held = False
            self.service.lock.release()

    def _close_gate(self) -> None:
        # Waits for the request being generated to finish; later ones wait for the next collect.
        self.service.lock.acquire()
        self._gate_held = True


def _served_step(group: TrajectoryGroup) -> int:
    """The oldest step a group's turns were served at (the ledger wrote it when it accepted the group)."""
    return min(int(t.metadata.get("served_step", 0)) for t in group.trajectories)


def _serve(app, bind: EndpointBind, previous_port: int | None):
    """Serve on the job's previous port when it is free and allowed, else on the first free one `bind` allows."""
    errors = []
    # The previous port first: agents started before a restart keep their URL.
    for port in bind.port_choices(previous_port):
        try:
            return serve_app_in_thread(app, bind.host, port)
        except OSError as error:
            if port == previous_port:
                log.warning("the endpoint's previous port %d is taken (%s); serving on another", port, error)
            errors.append(f"{port}: {error.strerror or error}")
    raise EndpointBindError(
        f"the student endpoint cannot listen on {bind.host}, ports {bind.ports[0]}-{bind.ports[1]}: every one is "
        f"taken or refused ({'; '.join(errors[:3])}); free one or widen the daemon's --agent-endpoint-addr range"
        if bind.ports
        else f"the student endpoint cannot listen on {bind.host} ({'; '.join(errors[:3])})"
    )
