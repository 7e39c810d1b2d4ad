"""The data cursor: reproducible epochs, and a resumed stream that continues exactly."""

from __future__ import annotations

import json

import pytest

from appliance.errors import CheckpointError, CheckpointMismatch
from appliance.tasks import Problem, ProblemStream


def problems(count: int) -> list[Problem]:
    return [Problem(id=f"p{index}", question=f"q{index}", answer=str(index)) for index in range(count)]


def ids(batch: list[Problem]) -> list[str]:
    return [problem.id for problem in batch]


def test_each_epoch_visits_every_problem_once_in_a_new_order():
    stream = ProblemStream(problems(12), seed=5)
    first, second = ids(stream.next_batch(12)), ids(stream.next_batch(12))
    assert sorted(first) == sorted(second) == sorted(ids(problems(12)))
    assert first != second
    assert stream.state_dict()["epoch"] == 1


def test_same_seed_same_order_other_seed_other_order():
    assert ids(ProblemStream(problems(20), seed=1).next_batch(30)) == ids(
        ProblemStream(problems(20), seed=1).next_batch(30)
    )
    assert ids(ProblemStream(problems(20), seed=1).next_batch(30)) != ids(
        ProblemStream(problems(20), seed=2).next_batch(30)
    )


@pytest.mark.parametrize("batches_before_checkpoint", [0, 1, 3, 4, 7])
def test_resume_continues_exactly_like_an_uninterrupted_stream(batches_before_checkpoint):
    uninterrupted = ProblemStream(problems(10), seed=42)
    expected = [ids(uninterrupted.next_batch(3)) for _ in range(batches_before_checkpoint + 6)]

    first_run = ProblemStream(problems(10), seed=42)
    for _ in range(batches_before_checkpoint):
        first_run.next_batch(3)
    saved = json.loads(json.dumps(first_run.state_dict()))  # as written into the checkpoint

    resumed = ProblemStream(problems(10), seed=42)
    resumed.load_state_dict(saved)
    assert [ids(resumed.next_batch(3)) for _ in range(6)] == expected[batches_before_checkpoint:]


def test_a_batch_larger_than_the_dataset_spans_epochs():
    stream = ProblemStream(problems(3), seed=0)
    batch = ids(stream.next_batch(7))
    assert len(batch) == 7
    assert sorted(batch[:3]) == ["p0", "p1", "p2"]
    assert stream.state_dict()["epoch"] == 2
    assert stream.state_dict()["position"] == 1


def test_resuming_on_different_data_is_refused():
    saved = ProblemStream(problems(10), seed=42).state_dict()
    with pytest.raises(CheckpointMismatch, match="num_problems=10, but this run has num_problems=11"):
        ProblemStream(problems(11), seed=42).load_state_dict(saved)
    with pytest.raises(CheckpointMismatch, match="seed=42, but this run has seed=7"):
        ProblemStream(problems(10), seed=7).load_state_dict(saved)


@pytest.mark.parametrize("cursor", [{"epoch": -1, "position": 0}, {"epoch": 0, "position": 11}])
def test_a_cursor_out_of_range_is_a_damaged_checkpoint_not_other_data(cursor):
    with pytest.raises(CheckpointError, match="out of range") as refused:
        ProblemStream(problems(10), seed=42).load_state_dict({**cursor, "num_problems": 10, "seed": 42})
    assert not isinstance(refused.value, CheckpointMismatch)  # resume falls back to the previous checkpoint
