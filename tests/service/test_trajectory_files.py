"""`appliance jobs submit-trajectories ID FILE` reads a JSON list, {"groups": [...]}, one group, or JSON Lines."""

from __future__ import annotations

import json

import pytest

from appliance.cli.jobs_cmd import _read_groups
from appliance.service.client import ClientError

GROUP = {"scenario_id": "s1", "trajectories": []}


@pytest.mark.parametrize(
    "text",
    [
        json.dumps([GROUP, GROUP]),
        json.dumps({"groups": [GROUP, GROUP]}),
        json.dumps(GROUP) + "\n" + json.dumps(GROUP) + "\n\n",
    ],
)
def test_the_accepted_layouts_give_the_groups(tmp_path, text):
    path = tmp_path / "groups.json"
    path.write_text(text)
    assert _read_groups(path) == [GROUP, GROUP]


def test_a_single_group_object_is_a_list_of_one(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps(GROUP))
    assert _read_groups(path) == [GROUP]


@pytest.mark.parametrize(
    "text, message",
    [
        (json.dumps(GROUP) + "\n{not json\n", r"groups.jsonl:2: not JSON"),
        ("[]", "holds no trajectory groups"),
    ],
)
def test_bad_files_name_the_file_and_line(tmp_path, text, message):
    path = tmp_path / "groups.jsonl"
    path.write_text(text)
    with pytest.raises(ClientError, match=message) as error:
        _read_groups(path)
    assert error.value.status == 400
    with pytest.raises(ClientError, match="cannot read .*missing.json"):
        _read_groups(tmp_path / "missing.json")
