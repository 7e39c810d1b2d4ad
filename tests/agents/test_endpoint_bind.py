"""Where an external job's student endpoint listens: the daemon's --agent-endpoint-addr/-host, tried as a hostile
or careless administrator would, and on real sockets (ports taken, another host's view, the daemon's forwarding)."""

from __future__ import annotations

import json
import time

import os
import socket

import httpx
import pytest

from appliance.agents.endpoint_bind import (
    ENV_ADDR,
    ENV_HOST,
    LOOPBACK_ANY_PORT,
    EndpointBind,
    EndpointBindError,
    bind_from_environment,
    parse_bind,
)
from appliance.agents.endpoint_file import read_endpoint_file
from appliance.cli.main import main
from appliance.service.daemon import Daemon, DaemonOptions
from appliance.service.external_forward import EndpointRefused, forward_trajectories, job_endpoint


@pytest.mark.parametrize(
    ("addr", "host", "words"),
    [
        ("nonsense:port", None, "must be HOST[:PORT[-PORT]]"),
        ("gpu-box.lab:9500", "gpu-box.lab", "must be an IP address to listen on"),
        ("0.0.0.0:9509-9500", "box", "low first"),
        ("0.0.0.0:0", "box", "within 1-65535"),
        ("0.0.0.0:70000", "box", "within 1-65535"),
        ("0.0.0.0:1-65535", "box", "at most 1024 ports"),
        ("0.0.0.0:9500", None, "also set --agent-endpoint-host"),
        ("[::]:9500", None, "also set --agent-endpoint-host"),
        ("127.0.0.1:9500", "gpu-box.lab", "listens on loopback only"),
        (None, "gpu-box.lab", "needs --agent-endpoint-addr"),
        ("0.0.0.0:9500", "bad host/with path", "is not a host name or IP address"),
        ("0.0.0.0:9500", "x" * 300, "is not a host name"),
        ("1" * 100_000, None, "--agent-endpoint-addr host '1111"),
        ("0.0.0.0:95\n00", "box", "must be HOST"),
    ],
    ids=lambda value: repr(value)[:24],
)
def test_a_bad_setting_is_one_error_naming_the_option(addr, host, words):
    with pytest.raises(EndpointBindError, match=words.replace("[", r"\[").replace("]", r"\]")) as refused:
        parse_bind(addr, host)
    assert "--agent-endpoint-" in str(refused.value) and len(str(refused.value)) < 400


def test_settings_round_trip_through_the_workers_environment():
    assert parse_bind(None) is LOOPBACK_ANY_PORT and LOOPBACK_ANY_PORT.environment() == {}
    for addr, host in [("0.0.0.0:9500-9509", "gpu-box.lab"), ("[::]:9500", "10.0.0.5"), ("10.1.2.3", "gpu-box")]:
        bind = parse_bind(addr, host)
        assert bind_from_environment({**os.environ, **bind.environment()}) == bind
    bind = parse_bind("[::]:9500", "gpu-box.lab")
    assert (bind.host, bind.ports, bind.client_url(9500)) == ("::", (9500, 9500), "http://gpu-box.lab:9500/v1")
    assert bind.local_url(9500) == "http://[::1]:9500/v1"
    with pytest.raises(EndpointBindError):  # a forged environment is checked as the option is
        bind_from_environment({ENV_ADDR: "0.0.0.0:1-2", ENV_HOST: "evil host"})


def test_the_previous_port_comes_first_only_when_the_range_allows_it():
    assert EndpointBind("0.0.0.0", (9500, 9502), "box").port_choices(9502) == [9502, 9500, 9501]
    assert EndpointBind("0.0.0.0", (9500, 9502), "box").port_choices(8000) == [9500, 9501, 9502]
    assert LOOPBACK_ANY_PORT.port_choices(8000) == [8000, 0] and LOOPBACK_ANY_PORT.port_choices(None) == [0]


def test_the_daemon_gives_its_setting_to_every_worker(tmp_path):
    bind = parse_bind("0.0.0.0:9500-9509", "gpu-box.lab")
    daemon = Daemon(DaemonOptions(data_dir=tmp_path / "data", agent_endpoint=bind))
    try:
        assert bind_from_environment({**os.environ, **daemon.supervisor.worker_env}) == bind
    finally:
        daemon.close()


def test_serve_refuses_a_bad_setting_before_it_starts(tmp_path, capsys):
    code = main(["serve", "--data-dir", str(tmp_path), "--agent-endpoint-addr", "0.0.0.0:9500"])
    assert code == 2
    assert "--agent-endpoint-addr '0.0.0.0:9500' listens on every address" in capsys.readouterr().err
    assert not (tmp_path / "appliance.lock").exists()  # nothing was started


def free_range(width: int) -> tuple[int, int]:
    """`width` consecutive ports free on every address right now."""
    for low in range(42000, 60000, 97):
        probes = []
        try:
            for port in range(low, low + width):
                probe = socket.socket()
                probes.append(probe)
                probe.bind(("0.0.0.0", port))
            return low, low + width - 1
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise AssertionError("no free port range")


@pytest.mark.model
def test_an_endpoint_on_every_address_is_reached_by_name_and_forwarded_to_over_loopback(tiny_engine, tmp_path):
    from appliance.agents.external_source import ExternalSource

    low, high = free_range(3)
    daemon = Daemon(DaemonOptions(data_dir=tmp_path / "data"))
    job = daemon.store.submit(
        "ext", uid=1000, user="alice", plan=None, steps_total=3, spec={"task": {"environment": "external"}}
    )
    daemon.store.transition(job.id, "running", "started on slot 0")
    daemon.store.update(job.id, pgid=os.getpid())  # this process plays the worker
    job_dir = daemon.job_dir(job.id)
    job_dir.mkdir(parents=True)
    bind = parse_bind(f"0.0.0.0:{low}-{high}", "gpu-box.invalid")
    source = ExternalSource(tiny_engine, job_dir, group_size=2, served_name="student", bind=bind)
    try:
        port = int(source.local_url.rsplit(":", 1)[1].removesuffix("/v1"))
        assert low <= port <= high
        handed_out = job_endpoint(daemon, job.id)
        assert handed_out.url == f"http://gpu-box.invalid:{port}/v1" == read_endpoint_file(job_dir)["url"]
        # Listening on every address: reached on another local address too (a loopback-only bind refuses it).
        answer = httpx.get(f"http://127.0.0.2:{port}/v1/models", headers={"Authorization": f"Bearer {source.token}"})
        assert answer.status_code == 200 and answer.json()["data"][0]["id"] == "student"
        # The daemon forwards over loopback, not to the public name (which does not even resolve here).
        with pytest.raises(EndpointRefused) as refused:
            forward_trajectories(daemon, job.id, json.dumps({"groups": [{"trajectories": []}]}).encode())
        assert refused.value.status == 422 and "cannot be reached" not in str(refused.value)
    finally:
        source.close()
        daemon.close()


@pytest.mark.model
def test_a_range_with_every_port_taken_is_refused_naming_it(tiny_engine, tmp_path):
    from appliance.agents.external_source import ExternalSource

    low, high = free_range(2)
    squatters = []
    for port in (low, high):
        squatter = socket.socket()
        squatter.bind(("0.0.0.0", port))
        squatter.listen()
        squatters.append(squatter)
    try:
        with pytest.raises(EndpointBindError, match=f"ports {low}-{high}: every one is taken"):
            ExternalSource(
                tiny_engine, tmp_path, group_size=2, served_name="s", bind=parse_bind(f"0.0.0.0:{low}-{high}", "box")
            )
        assert read_endpoint_file(tmp_path) is None  # no address handed out for a server that never listened
    finally:
        for squatter in squatters:
            squatter.close()


@pytest.mark.model
def test_an_external_job_with_no_trajectory_for_its_idle_time_ends_with_that_reason(tiny_engine, tmp_path):
    """It held the device for ever before; now the step that waits ends the job, saying why (the worker sends
    the ApplianceError as the job's failure reason)."""
    from appliance.agents.external_source import ExternalSource, NoTrajectories

    source = ExternalSource(tiny_engine, tmp_path, group_size=2, served_name="student", idle_seconds=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(NoTrajectories, match=r"no trajectory group arrived for 1 s .* step 1 waited for 2"):
            source.collect(step=1, scenarios=2, group_size=2)
        assert 1.0 <= time.monotonic() - started < 5.0
    finally:
        source.close()
