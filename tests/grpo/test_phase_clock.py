"""One name per phase: the clock enters the planned phase, times and announces the step's phase."""

import pytest

from appliance.grpo.step_record import PLANNED, PLANNED_PHASES, PhaseClock
from appliance.grpo.step_record import PHASES


def _clock():
    calls = []
    clock = PhaseClock(
        announce=lambda kind, **data: calls.append((kind, data["phase"], data["state"])),
        enter=lambda planned: calls.append(("enter", planned)),
    )
    return clock, calls


def test_a_phase_is_entered_announced_and_timed_under_its_one_name():
    clock, calls = _clock()
    for name in ("generate", "reward", "generate", "reward", "train", "sync"):
        with clock.phase(name):
            pass
    assert calls[3:6] == [("phase", "reward", "start"), ("enter", "judge"), ("phase", "reward", "end")]
    assert [c[1] for c in calls if c[0] == "enter"] == ["generate", "judge", "generate", "judge", "train"]
    assert set(clock.seconds) == {"generate", "reward", "train", "sync"}
    assert set(clock.total()) == {"generate", "reward", "train", "sync", "step"}


def test_the_phase_names_are_the_wire_names_and_the_planned_ones_are_time_shared():
    assert set(PLANNED) <= set(PHASES)
    assert {planned for planned in PLANNED.values() if planned} == set(PLANNED_PHASES)


def test_an_unknown_phase_is_refused_before_anything_is_entered():
    clock, calls = _clock()
    with pytest.raises(ValueError, match="'judge' is not one of"):
        with clock.phase("judge"):
            pass
    assert calls == [] and clock.seconds == {}


def test_a_failing_phase_still_counts_its_seconds_and_announces_its_end():
    clock, calls = _clock()
    with pytest.raises(RuntimeError):
        with clock.phase("train"):
            raise RuntimeError("out of memory")
    assert "train" in clock.seconds and calls[-1] == ("phase", "train", "end")
