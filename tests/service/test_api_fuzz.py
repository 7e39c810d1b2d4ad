"""A schema-driven fuzz of the whole control API: schemathesis generates requests for every route from the app's
own OpenAPI (valid and invalid parameters and bodies) and sends them to a real daemon over its TCP control port
(with the token: every route is open to it); no answer may be a 5xx. Bounded examples per route, so CI stays
cheap."""

from __future__ import annotations

import os
import time

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from appliance.service.routes import daemon_router, jobs_router
from daemon_support import Daemon, daemon_env, free_port, link_model_store, short_tmp_dir

EXAMPLES_PER_ROUTE = 25
TOKEN = "fuzz-token-" + "x" * 24
CALLS: list[float] = []


def openapi() -> dict:
    """The control API's OpenAPI document, as FastAPI builds it from the routes (the daemon does not serve it)."""
    app = FastAPI(title="appliance control API")
    app.include_router(daemon_router)
    app.include_router(jobs_router)
    document = app.openapi()
    # The events long-poll may wait 60 s by contract; a fuzzer waiting that long per example tests nothing more.
    for parameter in document["paths"]["/events"]["get"]["parameters"]:
        if parameter["name"] == "timeout":
            parameter["schema"]["maximum"] = 0.5
    return document


schema = schemathesis.openapi.from_dict(openapi())


@pytest.fixture(scope="module")
def tcp_daemon(tmp_path_factory, store_data_dir):
    tmp = tmp_path_factory.mktemp("fuzz")
    token_file = tmp / "token"
    token_file.write_text(TOKEN)
    os.chmod(token_file, 0o600)
    port = free_port()
    folder = short_tmp_dir()
    server = Daemon(
        link_model_store(store_data_dir, tmp / "data"),
        folder / "control.sock",
        free_port(),
        tmp / "daemon.log",
        ["--control-addr", f"127.0.0.1:{port}", "--control-token-file", str(token_file)],
        daemon_env(),
    )
    server.base_url = f"http://127.0.0.1:{port}"
    yield server.start()
    server.close()


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_generated_request_gets_a_server_error(case, tcp_daemon):
    started = time.monotonic()
    case.call_and_validate(
        base_url=tcp_daemon.base_url,
        headers={"Authorization": f"Bearer {TOKEN}"},
        checks=[not_a_server_error],
        timeout=70,
    )
    CALLS.append(time.monotonic() - started)


def test_the_daemon_answers_after_the_fuzz(tcp_daemon):
    assert tcp_daemon.proc.poll() is None
    assert tcp_daemon.client().status().version
    print(f"{len(CALLS)} fuzzed requests, {sum(CALLS):.1f} s in all, slowest {max(CALLS, default=0):.2f} s")
