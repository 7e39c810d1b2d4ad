"""External rollouts through the control API: a running job's student endpoint, and forwarding submitted groups.

`GET /jobs/{id}/endpoint` reads `<job>/endpoint.json`, which the job's worker
writes (0600) while it serves (a file left by an earlier worker of the job is
not handed out); `POST /jobs/{id}/trajectories` forwards the
body as it came (the daemon never parses it) over loopback to that endpoint's
submission route, with its token, so the groups are checked against the
served-token ledger where it lives, and the caller gets the worker's verdict (422 naming the group, trajectory and turn
when refused). Only jobs with `task.environment: external` have an endpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from appliance.agents.endpoint_file import SUBMIT_ROUTE, read_endpoint_file
from appliance.conventions import EXTERNAL_ENVIRONMENT
from appliance.service.api import EndpointInfo, TrajectoriesAccepted
from appliance.service.submission import SubmissionRejected

if TYPE_CHECKING:
    from appliance.service.daemon import Daemon

FORWARD_TIMEOUT_SECONDS = 300.0  # the check tokenises every trajectory; a busy CPU box is slow


class EndpointRefused(SubmissionRejected):
    """The job has no endpoint to give, or the endpoint refused what was submitted; `status` is the HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(status, message)


def job_endpoint(daemon: "Daemon", job_id: str) -> EndpointInfo:
    """The endpoint of running external job `job_id`, as its clients reach it; refused when there is none."""
    step, document = _serving_document(daemon, job_id)
    return EndpointInfo(job_id=job_id, url=document["url"], token=document["token"], model=document["model"], step=step)


def _serving_document(daemon: "Daemon", job_id: str) -> tuple[int, dict]:
    """The job's step and its running worker's endpoint.json; EndpointRefused when it serves none (yet)."""
    row = daemon.store.get(job_id)
    environment = (row.spec.get("task") or {}).get("environment")
    if environment != EXTERNAL_ENVIRONMENT:
        raise EndpointRefused(
            400,
            f"job '{job_id}' does not take external rollouts (its task.environment is "
            f"{environment!r}, not '{EXTERNAL_ENVIRONMENT}'); it has no student endpoint",
        )
    summary = row.summary
    if summary.state != "running":
        raise EndpointRefused(409, f"job '{job_id}' is {summary.state}; its endpoint is served only while it runs")
    document = read_endpoint_file(daemon.job_dir(job_id))
    # After a crash the dead worker's file stays until the restarted one serves: only the running worker's counts.
    if document is None or document.get("pid") != row.pgid:
        raise EndpointRefused(
            409,
            f"job '{job_id}' is starting and does not serve its endpoint yet (the model is"
            " loading); ask again in a few seconds",
        )
    return summary.step, document


def forward_trajectories(daemon: "Daemon", job_id: str, body: bytes) -> TrajectoriesAccepted:
    """Hand the request `body` ({"groups": [...]}) to the job's endpoint for checking and queueing; its verdict,
    as the API's answer."""
    _, document = _serving_document(daemon, job_id)
    # Over loopback, wherever else the endpoint listens (a worker from before local_url was written: its url).
    base = str(document.get("local_url") or document["url"]).removesuffix("/").removesuffix("/v1")
    try:
        response = httpx.post(
            base + SUBMIT_ROUTE,
            content=body,
            timeout=FORWARD_TIMEOUT_SECONDS,
            headers={"Authorization": f"Bearer {document['token']}", "Content-Type": "application/json"},
        )
    except httpx.TimeoutException:
        raise EndpointRefused(
            504,
            f"job '{job_id}''s endpoint did not answer within {FORWARD_TIMEOUT_SECONDS:g} s"
            " (the groups may still be queued: see the job's next steps)",
        ) from None
    except httpx.HTTPError as error:
        raise EndpointRefused(
            409, f"job '{job_id}''s endpoint cannot be reached ({error}); the job may be stopping"
        ) from None
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        # The worker's own refusals (4xx) pass through as they are; its failures are the gateway's (502).
        raise EndpointRefused(response.status_code if 400 <= response.status_code < 500 else 502, message)
    answer = response.json()
    return TrajectoriesAccepted(
        job_id=job_id,
        accepted=answer["accepted"],
        queued=answer["queued"],
        step=answer["step"],
        unserved_messages_dropped=answer.get("unserved_messages_dropped", 0),
    )
