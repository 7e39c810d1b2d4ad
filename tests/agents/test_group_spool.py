"""Submitted trajectory groups on disk: what a restarted worker of an external-rollout job finds and queues again.

No model: groups are plain data. The spool is what ExternalSource writes
before it answers "accepted" and deletes once a checkpoint holds the step;
test_external_restart.py runs the same over a real endpoint.
"""

from __future__ import annotations

import logging
import stat

from appliance.agents.spool import GroupSpool
from appliance.agents.trajectory import AssistantMessage, Trajectory, TrajectoryGroup, UserMessage
from appliance.paths import submitted_groups_dir


def group(name: str) -> TrajectoryGroup:
    trajectory = Trajectory(
        scenario_id=name,
        reward=1.0,
        messages=[UserMessage(content=f"question {name}"), AssistantMessage(content="answer")],
    )
    return TrajectoryGroup(scenario_id=name, trajectories=[trajectory, trajectory.model_copy()])


def names(entries) -> list[tuple[str, int | None]]:
    return [(entry.group.scenario_id, entry.taken_by) for entry in entries]


def test_accepted_groups_are_private_files_that_a_restart_finds_in_order(tmp_path):
    folder = submitted_groups_dir(tmp_path)
    spool = GroupSpool(folder)
    assert spool.load() == []
    first = spool.add([group("a"), group("b")])
    spool.add([group("c")])
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = sorted(folder.iterdir())
    assert [f.name for f in files] == ["000000000000.json", "000000000001.json", "000000000002.json"]
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    spool.take(first[:1], step=1)
    spool.take(first[1:], step=2)

    restarted = GroupSpool(folder)
    loaded = restarted.load()
    assert names(loaded) == [("a", 1), ("b", 2), ("c", None)]
    assert loaded[0].group == group("a")
    assert names(restarted.add([group("d")])) == [("d", None)]  # numbering goes on after the restart
    assert (folder / "000000000003.json").is_file()


def test_a_checkpoint_deletes_what_its_steps_took_and_nothing_else(tmp_path):
    spool = GroupSpool(tmp_path / "submitted")
    a, b, c = spool.add([group("a"), group("b"), group("c")])
    spool.take([a], 1)
    spool.take([b], 2)
    assert spool.drop_trained(1) == 1
    assert names(GroupSpool(tmp_path / "submitted").load()) == [("b", 2), ("c", None)]
    assert spool.drop_trained(2) == 1 and spool.drop_trained(5) == 0
    assert names(GroupSpool(tmp_path / "submitted").load()) == [("c", None)]


def test_the_first_step_after_a_restart_replays_its_groups_and_drops_the_checkpointed_ones(tmp_path):
    """Taken by steps 1, 2, 3; the crash came after the checkpoint of step 2 but before its deletion."""
    spool = GroupSpool(tmp_path / "submitted")
    entries = spool.add([group(name) for name in "abcd"])
    for step, entry in enumerate(entries[:3], start=1):
        spool.take([entry], step)

    restarted = GroupSpool(tmp_path / "submitted")
    queue = restarted.without_trained(restarted.load(), step=3)  # resumed from the checkpoint of step 2
    assert names(queue) == [("c", 3), ("d", None)]  # step 3 trains c again, then d
    assert names(GroupSpool(tmp_path / "submitted").load()) == [("c", 3), ("d", None)]  # a and b are gone
    restarted.take(queue[:1], 3)
    assert restarted.drop_trained(3) == 1
    assert names(GroupSpool(tmp_path / "submitted").load()) == [("d", None)]


def test_damaged_and_half_written_files_do_not_stop_a_restart(tmp_path, caplog):
    folder = tmp_path / "submitted"
    spool = GroupSpool(folder)
    spool.add([group("a"), group("b")])
    (folder / "000000000000.json").write_text('{"scenario_id": "a", "trajec')  # damaged outside the appliance
    (folder / ".000000000002.json.77.1.tmp").write_text("{")  # a crash before the rename: never accepted
    with caplog.at_level(logging.WARNING, logger="appliance.agents.spool"):
        loaded = GroupSpool(folder).load()
    assert names(loaded) == [("b", None)]
    assert "000000000000.json cannot be read" in caplog.text and "renamed to 000000000000.json.damaged" in caplog.text
    assert sorted(f.name for f in folder.iterdir()) == ["000000000000.json.damaged", "000000000001.json"]
