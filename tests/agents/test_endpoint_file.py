"""endpoint.json across the workers of one job: the token is kept, the last port remembered, "serving" only with a url."""

from __future__ import annotations

import stat

from appliance.agents.endpoint_file import (
    ENDPOINT_FILE,
    PreviousEndpoint,
    previous_endpoint,
    read_endpoint_file,
    write_endpoint,
)

TOKEN = "t" * 43


def test_a_serving_file_is_read_and_a_closed_one_only_keeps_token_and_port(tmp_path):
    assert previous_endpoint(tmp_path) == PreviousEndpoint(None, None)  # a new job
    serving = {"url": "http://127.0.0.1:41234/v1", "token": TOKEN, "model": "student", "pid": 7}
    write_endpoint(tmp_path, serving)
    assert stat.S_IMODE((tmp_path / ENDPOINT_FILE).stat().st_mode) == 0o600
    assert read_endpoint_file(tmp_path) == serving
    assert previous_endpoint(tmp_path) == PreviousEndpoint(TOKEN, 41234)  # a crashed worker's file
    write_endpoint(tmp_path, {"token": TOKEN, "model": "student", "last_url": "http://127.0.0.1:41235/v1"})
    assert read_endpoint_file(tmp_path) is None  # not serving
    assert previous_endpoint(tmp_path) == PreviousEndpoint(TOKEN, 41235)


def test_a_damaged_or_weak_file_gives_no_token(tmp_path):
    (tmp_path / ENDPOINT_FILE).write_text("{not json")
    assert previous_endpoint(tmp_path) == PreviousEndpoint(None, None)
    write_endpoint(tmp_path, {"token": "short", "url": "http://127.0.0.1:notaport/v1"})
    assert previous_endpoint(tmp_path) == PreviousEndpoint(None, None)
