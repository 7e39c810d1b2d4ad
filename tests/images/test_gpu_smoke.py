"""images/gpu-smoke without a GPU: its arguments, the order of what it runs, its table and verdicts.

Only nvidia-smi is a stand-in (the hardware boundary): a script on PATH that answers the queries the
smoke makes from files the test writes. The plan it judges comes from the real `appliance plan --json`
of the job the smoke writes, the step record from the real StepRecord type, the container runtime is the
real podman (with --pull never, an image that is not there fails at once and nothing is fetched).
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from appliance.grpo.step_record import MemoryReading, RewardStats, StepRecord
from packaging_support import image_storage_env

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOKE = REPO_ROOT / "images" / "gpu-smoke"
GiB = 1024**3
STAND_IN = """#!/bin/sh
# nvidia-smi stand-in: answers from files in $FAKE_SMI
case "$*" in
  *--query-gpu=index,name,memory.total*) cat "$FAKE_SMI/gpus" ;;
  *--query-compute-apps*) cat "$FAKE_SMI/apps" ;;
  *--query-gpu=memory.used*) cat "$FAKE_SMI/used" ;;
  *) echo "stand-in: unexpected $*" >&2; exit 64 ;;
esac
echo "$*" >> "$FAKE_SMI/calls"
exit "$(cat "$FAKE_SMI/rc" 2>/dev/null || echo 0)"
"""


def load_smoke() -> types.ModuleType:
    loader = importlib.machinery.SourceFileLoader("gpu_smoke", str(SMOKE))
    module = types.ModuleType(loader.name)
    loader.exec_module(module)
    return module


@pytest.fixture
def smi(tmp_path: Path) -> Path:
    """A folder with the stand-in nvidia-smi (bin/) and its answers: one idle H100."""
    folder = tmp_path / "smi"
    (folder / "bin").mkdir(parents=True)
    script = folder / "bin" / "nvidia-smi"
    script.write_text(STAND_IN)
    script.chmod(0o755)
    (folder / "gpus").write_text("0, NVIDIA H100 80GB HBM3, 81559\n")
    (folder / "apps").write_text("")
    (folder / "used").write_text("512\n")
    return folder


def smoke(*argv, smi: Path | None = None, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**image_storage_env(), "FAKE_SMI": str(smi or "")}
    env["PATH"] = path if path is not None else f"{smi / 'bin'}:{os.environ['PATH']}" if smi else os.environ["PATH"]
    return subprocess.run(
        [sys.executable, SMOKE, *map(str, argv)], capture_output=True, text=True, env=env, timeout=120
    )


def rows(out: str) -> dict[str, tuple[str, str]]:
    table = {}
    for line in out.splitlines()[1:]:
        check, rest = line[:28].strip(), line[28:].split(None, 1)
        table[check] = (rest[0], rest[1] if len(rest) > 1 else "")
    return table


@pytest.mark.parametrize(
    "argv, said",
    [
        ([], "give --student NAME (the smoke job) or --job FILE"),
        (["--student", "s", "--job", "j.yaml"], "one of the two"),
        (["--job", "/nonexistent/job.yaml", "--image", "x"], "--job /nonexistent/job.yaml: no such file"),
        (["--student", "s", "--image", "x", "--tolerance", "-0.1"], "give a fraction between 0 and 1"),
        (["--student", "s", "--image", "x", "--runtime", "lxc"], "invalid choice: 'lxc'"),
        (["--student", "s"], "no --image TAG and no Image= line in /etc/containers/systemd/appliance.container"),
    ],
)
def test_bad_arguments_are_refused_in_one_sentence(argv, said):
    if "--image" not in argv and Path("/etc/containers/systemd/appliance.container").exists():
        pytest.skip("this machine has the unit installed")
    refused = smoke(*argv)

    assert refused.returncode == 2 and said in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_help_prints_the_whole_header():
    shown = smoke("--help")

    assert shown.returncode == 0
    assert "with appliance.service stopped" in shown.stdout and "Exit 0 when every row passes" in shown.stdout


def test_the_dry_run_lists_the_commands_in_order(smi: Path, tmp_path: Path):
    # --runtime named: by default the smoke takes podman only where it is installed (a fresh box may have docker).
    listed = smoke("--student", "qwen", "--image", "localhost/appliance:0.1.0", "--data-dir", tmp_path / "data",
                   "--runtime", "podman", "--dry-run", smi=smi)  # fmt: skip
    lines = listed.stdout.splitlines()

    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in lines] == [
        "nvidia-smi",
        "nvidia-smi",
        "write",
        "podman",
        "nvidia-smi",
        "podman",
    ]
    plan, train = lines[3].split(), lines[5].split()
    assert plan[plan.index("--entrypoint") + 1 :][:3] == ["appliance", "localhost/appliance:0.1.0", "plan"]
    assert "--json" in plan and train[train.index("localhost/appliance:0.1.0") + 1] == "train"
    for command in (plan, train):
        assert ["--pull", "never"] == command[3:5] and "nvidia.com/gpu=all" in command
        assert (
            f"{tmp_path / 'data'}:/var/lib/appliance" in command
            and "/var/lib/appliance-models/current:/models:ro" in command
        )
        assert command[-2:] == ["--data-dir", "/var/lib/appliance/gpu-smoke"]
    assert not (tmp_path / "data").exists()  # a dry run writes nothing
    docker = smoke("--student", "q", "--image", "i", "--runtime", "docker", "--dry-run", smi=smi)
    assert "--gpus all" in docker.stdout and "nvidia.com/gpu" not in docker.stdout


def test_no_nvidia_smi_fails_the_first_row_and_runs_nothing_else(tmp_path: Path):
    empty = tmp_path / "bin"
    empty.mkdir()
    ran = smoke("--student", "q", "--image", "i", "--data-dir", tmp_path / "data", path=str(empty))

    table = rows(ran.stdout)
    assert ran.returncode == 1
    assert table["GPU visible"] == ("FAIL", "nvidia-smi is not installed: install the NVIDIA driver")
    assert [result for result, _ in table.values()][1:] == ["SKIP"] * 6
    assert not (tmp_path / "data").exists()


def test_a_driver_that_does_not_answer_is_named(smi: Path, tmp_path: Path):
    (smi / "rc").write_text("9")
    (smi / "gpus").write_text("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")

    ran = smoke("--student", "q", "--image", "i", "--data-dir", tmp_path / "data", smi=smi)

    assert ran.returncode == 1
    assert rows(ran.stdout)["GPU visible"] == (
        "FAIL", "nvidia-smi failed: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")  # fmt: skip


def test_a_busy_gpu_stops_the_smoke_before_any_container(smi: Path, tmp_path: Path):
    (smi / "apps").write_text("4242, /opt/appliance/bin/python, 30100\n")

    ran = smoke("--student", "q", "--image", "i", "--data-dir", tmp_path / "data", smi=smi)

    table = rows(ran.stdout)
    assert ran.returncode == 1
    assert table["GPU visible"][0] == "PASS" and "NVIDIA H100 80GB HBM3, 81559 MiB" in table["GPU visible"][1]
    assert table["GPU idle"] == (
        "FAIL", "pid 4242 /opt/appliance/bin/python (30100 MiB): stop it first (systemctl stop appliance.service)")  # fmt: skip
    assert table["plan fits"][0] == "SKIP"


def test_an_image_that_is_not_there_fails_the_plan_row_without_a_pull(smi: Path, tmp_path: Path):
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (images/ci-setup installs it)")
    data = tmp_path / "data"
    data.mkdir()

    ran = smoke("--student", "q", "--image", "localhost/appliance:not-built", "--data-dir", data, smi=smi)

    table = rows(ran.stdout)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert [table[c][0] for c in ("GPU visible", "GPU idle", "plan fits", "one GRPO step")] == [
        "PASS",
        "PASS",
        "FAIL",
        "SKIP",
    ]
    assert "localhost/appliance:not-built" in table["plan fits"][1]
    assert "gpu-smoke" in (data / "gpu-smoke" / "job.yaml").read_text()
    calls = (smi / "calls").read_text().splitlines()
    assert calls[0].startswith("--query-gpu=index,name,memory.total") and calls[1].startswith("--query-compute-apps")


# ----- the verdicts, on real inputs ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_plan(store_data_dir, tmp_path_factory) -> dict:
    """`appliance plan --json` of the job the smoke writes, for an 80 GiB CUDA device."""
    job = tmp_path_factory.mktemp("plan") / "job.yaml"
    job.write_text(load_smoke().SMOKE_JOB.format(name="gpu-smoke", student="smollm2-135m-instruct",
                                                 judge="smollm2-135m-instruct"))  # fmt: skip
    planned = subprocess.run(
        [sys.executable, "-m", "appliance.cli.main", "plan", str(job), "--json", "--device-memory", "80GiB",
         "--data-dir", str(store_data_dir)], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    return json.loads(planned.stdout)


def test_the_smoke_job_plans_with_vllm_and_its_plan_passes(real_plan: dict):
    gpu_smoke = load_smoke()
    table = gpu_smoke.Table()

    kept = gpu_smoke.check_plan(table, subprocess.CompletedProcess([], 0, json.dumps(real_plan), ""))

    assert kept is not None and table.rows[0][:2] == ("plan fits", "PASS")
    assert "rollout vllm, judge vllm" in table.rows[0][2]


def test_a_plan_that_does_not_fit_or_is_not_vllm_fails(real_plan: dict):
    gpu_smoke = load_smoke()
    table = gpu_smoke.Table()
    too_big = {**real_plan, "fits": False}
    hf = {**real_plan, "engines": {"rollout": "hf", "judge": "hf"}}

    for plan in (too_big, hf):
        assert gpu_smoke.check_plan(table, subprocess.CompletedProcess([], 0, json.dumps(plan), "")) is None
    assert gpu_smoke.check_plan(table, subprocess.CompletedProcess([], 125, "", "Error: image not known\n")) is None
    assert [row[1] for row in table.rows] == ["FAIL"] * 3
    assert "does not fit" in table.rows[0][2] and "set engine.rollout/judge: vllm" in table.rows[1][2]
    assert table.rows[2][2] == "Error: image not known"


def record(student_tokens: int, judge_outcomes: dict[str, int]) -> str:
    """One metrics.jsonl line as the trainer writes it (the real StepRecord type)."""
    step = StepRecord(
        job="gpu-smoke", step=1, steps_total=1, time=1.79e9, reward_mean=0.5, reward_std=0.5,
        rewards={"correctness": RewardStats(0.5, 0.5)}, loss=0.01, kl=0.0, clip_ratio=0.0, grad_norm=0.3,
        learning_rate=1e-5, nonfinite=False, groups_informative=1, groups_total=2, trained_sequences=8,
        trained_tokens=200, micro_batch_size=8, completions=8, completion_length_mean=12.0, completion_length_max=32,
        generated_tokens={"student": student_tokens, "judge": 40}, prompt_tokens={"student": 300},
        tokens_per_second={"student": 850.0}, seconds={"generate": 2.0, "step": 9.0},
        memory=MemoryReading(peak_rss_bytes=2 * GiB), judge_outcomes=judge_outcomes,
    )  # fmt: skip
    return json.dumps(step.to_dict()) + "\n"


def test_a_step_that_generated_and_was_judged_passes(tmp_path: Path):
    gpu_smoke = load_smoke()
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(record(96, {"ok": 8}))
    table = gpu_smoke.Table()

    assert gpu_smoke.check_step(table, metrics)
    assert table.rows == [
        ("vLLM generates (nf4 + LoRA)", "PASS", "96 student tokens at 850 tokens/s, 8 completions"),
        ("judge scores", "PASS", "ok 8"),
    ]


def test_no_tokens_a_failing_judge_or_no_record_fail(tmp_path: Path):
    gpu_smoke = load_smoke()
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(record(0, {"parse_error": 8}))
    table = gpu_smoke.Table()

    assert not gpu_smoke.check_step(table, metrics)
    assert not gpu_smoke.check_step(table, tmp_path / "missing.jsonl")
    assert [row[1] for row in table.rows] == ["FAIL", "FAIL", "FAIL"]
    assert table.rows[1][2] == "parse_error 8" and "no step record in" in table.rows[2][2]


def test_the_measured_peak_is_held_against_the_plan(real_plan: dict):
    gpu_smoke = load_smoke()
    table = gpu_smoke.Table()
    planned, baseline = real_plan["peak_bytes"], GiB // 2

    within = gpu_smoke.check_memory(table, real_plan, baseline, baseline + int(planned * 1.05), 0.10)
    over = gpu_smoke.check_memory(table, real_plan, baseline, baseline + int(planned * 1.25), 0.10)
    nothing = gpu_smoke.check_memory(table, real_plan, baseline, 0, 0.10)  # the sampler never read a value

    assert (within, over, nothing) == (True, False, False)
    assert "= 105% of the planned" in table.rows[0][2] and "= 125% of the planned" in table.rows[1][2]
    print(table.render())
    assert table.render().splitlines()[0].split() == ["check", "result", "detail"]
