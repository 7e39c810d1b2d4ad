"""Where a job's processes run on a box of GPUs (appliance/ranks.py): each student rank on its device, a judge with
devices of its own on exactly those, decided by one rule for `appliance train` and for the daemon.

The box is the hardware boundary: a folder standing in for the driver's list of GPUs, and vllm.LLM recording the
devices it was started with (no GPU here)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from appliance.config.job_file import parse_job_text
from appliance.engines.vllm_engine import VLLMEngine
from appliance.grpo.distributed import LAUNCHER, process_role
from appliance.ranks import PlacementError, device_layout, visible_devices
from appliance.service.slot_assignment import assign, devices_env, Waiting
from appliance.service.supervisor import probe_slots

JOB = (
    "name: j\nstudent: {model: s}\njudge: {model: big-judge}\nrewards: [{name: judge}]\n"
    "engine: {judge: vllm}\nresources: {gpus: 5, judge_gpus: 4}\n"
)


@pytest.fixture
def five_gpus(tmp_path):
    """The driver's list of a box with five GPUs."""
    folder = tmp_path / "gpus"
    for index in range(5):
        (folder / f"0000:0{index}:00.0").mkdir(parents=True)
    return folder


class RecordingLLM:
    """vllm.LLM at the hardware boundary: the arguments it got and the devices its processes would see."""

    started: list[tuple[dict, str | None]] = []

    def __init__(self, **llm_args):
        RecordingLLM.started.append((llm_args, os.environ.get("CUDA_VISIBLE_DEVICES")))


API = SimpleNamespace(LLM=RecordingLLM, SamplingParams=dict, LoRARequest=dict, TokensPrompt=dict)


def _judge_started_on(world, tmp_path) -> tuple[dict, str | None]:
    """What make_judge starts for this process's judge (grpo/run.py): vLLM over world.judge_devices."""
    (tmp_path / "judge").mkdir(exist_ok=True)
    (tmp_path / "judge" / "config.json").write_text("{}")
    RecordingLLM.started.clear()
    spec = parse_job_text(JOB)
    VLLMEngine.for_judge(spec, tmp_path / "judge", kv_cache_bytes=1 << 30, device="cuda", vllm_api=API,
                         devices=world.judge_devices)  # fmt: skip
    [started] = RecordingLLM.started
    return started


def test_the_layout_gives_the_student_the_first_device_and_the_judge_the_next_four():
    layout = device_layout(1, 4, ["0", "1", "2", "3", "4"])
    assert (layout.student, layout.judge) == (("0",), ("1", "2", "3", "4"))
    assert device_layout(2, 0, ["6", "7"]).student == ("6", "7")
    assert device_layout(1, 4, []).judge == ()  # a CPU box: everything on the CPU
    with pytest.raises(PlacementError, match="5 in all, and 3 are visible"):
        device_layout(1, 4, ["0", "1", "2"])


def test_from_the_command_line_the_student_sees_device_0_and_the_judges_tp4_group_devices_1_to_4(five_gpus, tmp_path):
    """`appliance train` decides its role with the job's resources (cli/train_cmd.train)."""
    environ = {}
    world = process_role(parse_job_text(JOB).resources, environ=environ, gpus_dir=five_gpus)
    assert world != LAUNCHER and world.world_size == 1
    assert environ["CUDA_VISIBLE_DEVICES"] == "0"  # this process, and what it starts, sees the student's device
    assert world.judge_devices == ("1", "2", "3", "4")
    args, devices = _judge_started_on(world, tmp_path)
    assert args["tensor_parallel_size"] == 4 and devices == "1,2,3,4"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ or os.environ["CUDA_VISIBLE_DEVICES"] != "1,2,3,4"


def test_from_the_daemon_the_job_holds_five_slots_and_its_worker_places_the_same_way(five_gpus, tmp_path):
    """The daemon's slots on the same box, the job's five contiguous ones made visible to its worker
    (service/supervisor.py), and the worker's role (service/worker.py) from that environment."""
    slots = probe_slots({}, five_gpus)
    assert [slot.env["CUDA_VISIBLE_DEVICES"] for slot in slots] == ["0", "1", "2", "3", "4"]
    [(job, held)] = assign(slots, set(), [Waiting("j", 5)])
    environ = devices_env(held)
    assert environ == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4"}
    world = process_role(parse_job_text(JOB).resources, environ=environ, gpus_dir=five_gpus)
    assert environ["CUDA_VISIBLE_DEVICES"] == "0" and world.judge_devices == ("1", "2", "3", "4")
    args, devices = _judge_started_on(world, tmp_path)
    assert args["tensor_parallel_size"] == 4 and devices == "1,2,3,4"


def test_each_launched_rank_sees_its_own_device_of_the_box(five_gpus):
    for local_rank, device in enumerate(["2", "3"]):
        environ = {"CUDA_VISIBLE_DEVICES": "2,3", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": str(local_rank),
                   "LOCAL_RANK": str(local_rank)}  # fmt: skip
        world = process_role(environ=environ, gpus_dir=five_gpus)
        assert (world.rank, world.world_size, environ["CUDA_VISIBLE_DEVICES"]) == (local_rank, 2, device)


def test_a_job_of_several_ranks_makes_this_process_their_launcher(five_gpus):
    spec = parse_job_text("name: j\nstudent: {model: s}\nrewards: [{name: correctness}]\nresources: {gpus: 2}\n")
    assert process_role(spec.resources, environ={}, gpus_dir=five_gpus) == LAUNCHER


def test_the_visible_devices_are_the_drivers_narrowed_by_cuda_visible_devices(five_gpus, tmp_path):
    assert visible_devices({}, five_gpus) == ["0", "1", "2", "3", "4"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "3,1"}, five_gpus) == ["3", "1"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "0"}, tmp_path / "none") == []  # a CPU box


@pytest.mark.parametrize(
    ("resources", "visible"),
    [("{gpus: 2}", "3"), ("{gpus: 4, nodes: 2}", "0,1"), ("{gpus: 5, judge_gpus: 4}", "0,1")],
)
def test_a_box_with_fewer_devices_than_the_job_places_is_refused_before_any_rank_starts(five_gpus, resources, visible):
    """A job whose ranks (or judge) need more devices than are visible was found out only inside each forked rank
    (a ValueError traceback, then 'resume continues from the last checkpoint'), or as a traceback of
    `appliance train`: the launcher (or the one process) now refuses it as a bad job, exit 2, in one sentence."""
    from appliance.errors import ApplianceError

    spec = parse_job_text(
        "name: j\nstudent: {model: s}\njudge: {model: big-judge}\nrewards: [{name: judge}]\n"
        f"engine: {{judge: vllm}}\nresources: {resources}\n"
    )
    with pytest.raises(ApplianceError, match="are visible \\(CUDA_VISIBLE_DEVICES\\)") as refused:
        process_role(spec.resources, environ={"CUDA_VISIBLE_DEVICES": visible}, gpus_dir=five_gpus)
    assert refused.value.exit_code == 2 and str(refused.value).count(". ") == 0
