"""The cpu-profile image as CI builds it: what it runs, as whom, offline, and that it works.

Each check reads the built image (see conftest.py); images/ci-build-check builds it first.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from appliance import __version__
from appliance.offline import OFFLINE_ENVIRONMENT
from packaging_support import link_or_copy

pytestmark = pytest.mark.image

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GPU_EXAMPLES = {"gsm8k-qwen7b-gpu.yaml"}  # name folders under the GPU box's /models


def readable_copy(models: Path, into: Path) -> Path:
    """The provisioned store as the appliance user may read it: hard links (no 500 MB copy) under
    directories opened to others, as images/install-bundle leaves the box's store."""

    shutil.copytree(models, into, copy_function=link_or_copy, symlinks=False)
    for folder in [into, *[path for path in into.rglob("*") if path.is_dir()]]:
        folder.chmod(0o755)
    return into


def test_version_runs_as_the_appliance_user(image):
    result = image.run("appliance", "--version")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"appliance {__version__}"


def test_the_image_runs_as_a_non_root_appliance_user(image):
    name, _, uid, gid, _, home, shell = image.passwd_entry("appliance")

    assert image.config["User"] == "appliance"
    assert int(uid) != 0 and int(gid) != 0
    # Fixed ids: systemd/appliance.sysusers.conf creates the same ones on the host.
    assert (uid, gid) == ("10001", "10001")
    assert (home, shell) == ("/var/lib/appliance", "/usr/sbin/nologin")
    assert image.run("id", "-un").stdout.strip() == "appliance"


def test_every_offline_variable_is_set_in_the_image(image):
    env = image.env

    missing = {key: value for key, value in OFFLINE_ENVIRONMENT.items() if env.get(key) != value}

    assert missing == {}, f"the image must set {missing}"


def test_state_socket_and_model_folders(image):
    for folder, mode in [("var/lib/appliance", 0o750), ("run/appliance", 0o750)]:
        stat = (image.root / folder).stat()
        assert (stat.st_uid, stat.st_gid, stat.st_mode & 0o777) == (10001, 10001, mode), folder
    models = (image.root / "models").stat()
    assert (models.st_uid, models.st_mode & 0o777) == (0, 0o755)
    assert image.env["APPLIANCE_MODELS_DIR"] == "/models"
    assert image.env["APPLIANCE_DATA_DIR"] == "/var/lib/appliance"
    assert "/var/lib/appliance" in image.config.get("Volumes", {})


def test_the_wheelhouse_stays_out_of_the_image(image, base_image: dict):
    # Bind-mounted during the build, never copied: what the image keeps of it is the lock and the
    # application wheel's sha256 (the COPYs that key the layer cache), and no wheels. Layers on the base:
    # the install script, the lock, the dependencies, the sha256, the application (one layer where a
    # build commits once with --layers=false).
    added = len(image.inspect["RootFS"]["Layers"]) - len(base_image["RootFS"]["Layers"])
    assert added in (1, 5)
    assert not (image.root / "tmp" / "wheels").exists() and not (image.root / "tmp" / "app").exists()
    assert list((image.root / "opt" / "appliance").rglob("*.whl")) == []
    share = image.root / "opt" / "appliance" / "share"
    assert (share / "appliance.sha256").read_text().split()[1].startswith("appliance-")
    assert "--hash=sha256:" in (share / "requirements.lock").read_text()


def test_oci_labels_name_version_revision_and_base(image):
    labels = image.config.get("Labels") or {}

    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.opencontainers.image.revision"] not in ("", "unknown")
    assert labels["org.opencontainers.image.base.digest"].startswith("sha256:")


def test_entrypoint_is_the_daemon_with_flags_it_knows(image):
    entrypoint, arguments = image.config["Entrypoint"], image.config["Cmd"]
    assert entrypoint == ["appliance", "serve"]
    flags = dict(zip(arguments[::2], arguments[1::2]))
    assert flags == {
        "--data-dir": "/var/lib/appliance",
        "--socket": "/run/appliance/control.sock",
        "--group": "appliance",
        "--metrics-addr": "0.0.0.0:9464",
        "--stop-timeout": "150",
    }

    help_text = image.run(*entrypoint, "--help")

    assert help_text.returncode == 0, help_text.stderr
    for flag in flags:
        assert flag in help_text.stdout, f"'appliance serve' in the image does not take {flag}"


def test_healthcheck_asks_the_daemon(image):
    check = image.inspect["Healthcheck"]  # podman keeps a docker-format image's HEALTHCHECK here

    assert check["Test"][0] == "CMD"
    command = check["Test"][1:]
    assert command[:3] == ["appliance", "jobs", "list"]
    # The command exists in the image and fails when no daemon answers (as in this chroot).
    result = image.run(*command)
    assert result.returncode != 0
    assert "control.sock" in result.stderr


def test_config_check_passes_on_every_example_against_the_read_only_store(image, store_data_dir: Path, tmp_path: Path):
    models = readable_copy(store_data_dir / "models", tmp_path / "models")
    cpu = sorted(f"/mnt/{path.name}" for path in EXAMPLES.glob("*.yaml") if path.name not in GPU_EXAMPLES)
    gpu = sorted(f"/mnt/{name}" for name in GPU_EXAMPLES)
    binds = {models: "/models", EXAMPLES: "/mnt"}

    full = image.run("appliance", "config", "check", *cpu, binds=binds)
    foreign = image.run("appliance", "config", "check", "--no-model-check", *gpu, binds=binds)

    assert full.returncode == 0, full.stderr
    assert full.stdout.count(": ok (") == len(cpu)
    assert foreign.returncode == 0, foreign.stderr


def test_the_daemon_and_the_engine_stack_import_with_the_cpu_torch(image):
    # The daemon's own modules too: its web stack (uvicorn, fastapi) must be in the wheelhouse.
    code = (
        "import appliance.service.server, appliance.service.control, appliance.service.worker; "
        "import torch, transformers, peft, bitsandbytes, vllm; "
        "print(torch.__version__, transformers.__version__, vllm.__version__)"
    )

    result = image.run("python", "-c", code)

    assert result.returncode == 0, result.stderr[-3000:]
    torch_version, transformers_version, vllm_version = result.stdout.split()[-3:]
    assert torch_version == "2.13.0+cpu"
    assert transformers_version == "5.19.0"
    assert vllm_version.startswith("0.32.0")
