"""`GET /jobs/{id}/endpoint` hands out only the running worker's endpoint (job_endpoint over a real, unstarted daemon).

A worker that crashed leaves its endpoint.json naming it; until the
restarted worker serves, the daemon says "starting" instead of giving out the
dead address. A worker that stopped serving leaves only the token (no url).
"""

from __future__ import annotations

import pytest

from appliance.agents.endpoint_file import write_endpoint
from appliance.service.daemon import Daemon, DaemonOptions
from appliance.service.external_forward import EndpointRefused, job_endpoint

TOKEN = "k" * 43


@pytest.fixture
def daemon(tmp_path):
    daemon = Daemon(DaemonOptions(data_dir=tmp_path / "data"))
    yield daemon
    daemon.close()


def test_only_the_running_workers_endpoint_is_handed_out(daemon):
    job = daemon.store.submit(
        "ext",
        uid=1000,
        user="alice",
        plan=None,
        steps_total=3,
        spec={"name": "ext", "student": {"model": "m"}, "task": {"environment": "external"}},
    )
    daemon.store.transition(job.id, "running", "started on slot 0")
    daemon.store.update(job.id, pgid=4242)
    job_dir = daemon.job_dir(job.id)
    job_dir.mkdir(parents=True)
    with pytest.raises(EndpointRefused, match="is starting and does not serve its endpoint yet"):
        job_endpoint(daemon, job.id)  # the model is loading: no file yet
    write_endpoint(job_dir, {"url": "http://127.0.0.1:40001/v1", "token": TOKEN, "model": "m", "pid": 4141})
    with pytest.raises(EndpointRefused, match="is starting") as refused:
        job_endpoint(daemon, job.id)  # the file of the worker that died, before the restarted one serves
    assert refused.value.status == 409
    write_endpoint(job_dir, {"url": "http://127.0.0.1:40001/v1", "token": TOKEN, "model": "m", "pid": 4242})
    served = job_endpoint(daemon, job.id)
    assert (served.url, served.token, served.model, served.step) == ("http://127.0.0.1:40001/v1", TOKEN, "m", 0)
    write_endpoint(job_dir, {"token": TOKEN, "model": "m", "last_url": "http://127.0.0.1:40001/v1"})
    with pytest.raises(EndpointRefused, match="is starting"):
        job_endpoint(daemon, job.id)  # stopped serving (the job is ending): the token is kept, not handed out
