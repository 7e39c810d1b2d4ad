"""Ranks on one box share its cores: OMP_NUM_THREADS is each rank's share unless the operator set it."""

from __future__ import annotations

import os

import pytest

from appliance.cli.main import build_parser
from appliance.cli.train_cmd import train_rank
from appliance.ranks import LaunchError, Topology, launch_ranks, share_cores, threads_per_rank


def test_each_rank_gets_its_share_of_the_cores_and_at_least_one():
    assert threads_per_rank(2, cores=2) == 1
    assert threads_per_rank(3, cores=16) == 5
    assert threads_per_rank(8, cores=4) == 1
    assert threads_per_rank(1, cores=16) == 16


def test_an_operators_setting_wins_and_one_rank_is_left_alone():
    env = {"OMP_NUM_THREADS": "7"}
    share_cores(env, 4)
    assert env == {"OMP_NUM_THREADS": "7"}
    alone: dict[str, str] = {}
    share_cores(alone, 1)
    assert alone == {}


def test_the_launcher_gives_its_ranks_their_share(tmp_path, monkeypatch):
    """A real 2-rank launch (its ranks fail at once: the data dir has no model): the ranks inherit the share."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    job_file = tmp_path / "job.yaml"
    job_file.write_text("name: shares\nstudent: {model: smollm2-135m-instruct}\nrewards: [{name: correctness}]\n")
    job_file.write_text(job_file.read_text() + "resources: {gpus: 2}\n")
    args = build_parser().parse_args(["train", str(job_file), "--data-dir", str(tmp_path / "empty-data")])
    with pytest.raises(LaunchError, match="rank 0 .*failed|rank 1 .*failed"):
        launch_ranks("shares", Topology(1, None, None, 2), train_rank, (args,), tmp_path / ".launch")
    assert os.environ["OMP_NUM_THREADS"] == str(threads_per_rank(2))
