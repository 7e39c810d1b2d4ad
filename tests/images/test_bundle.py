"""The air-gapped bundle made from the built image: complete, verified on arrival, refused when
tampered with, and its client wheels install `appliance jobs` and `appliance-tui` offline."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from appliance import __version__
from appliance.models.provision import DEMO_MODEL_NAME
from packaging_support import appliance_cli, image_storage_env

pytestmark = pytest.mark.image

REPO_ROOT = Path(__file__).resolve().parents[2]


def run(*argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(arg) for arg in argv], capture_output=True, text=True, **kwargs)


def client_wheels() -> list[str]:
    """images/ci-build-check has built the client wheelhouse already; the bundle builds one where it has not."""
    built = os.environ.get("APPLIANCE_CLIENT_WHEELHOUSE")
    return ["--client-wheels", built] if built else []


@pytest.fixture(scope="module")
def bundle(image, store_data_dir: Path, signing_key, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "appliance-bundle"
    env = {**image_storage_env(), "GNUPGHOME": str(signing_key.home)}
    made = run(
        REPO_ROOT / "images" / "bundle",
        "--out",
        out,
        "--image",
        image.tag,
        "--model",
        DEMO_MODEL_NAME,
        "--data-dir",
        store_data_dir,
        "--sign-key",
        signing_key.uid,
        *client_wheels(),
        env=env,
        timeout=900,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    yield out
    shutil.rmtree(out.parent)  # about 4 GB, the image archive most of it


@pytest.fixture(scope="module")
def keyring(signing_key) -> Path:
    return signing_key.keyring


def test_the_bundle_holds_image_model_client_units_and_monitoring(bundle: Path):
    listed = {line.split("  ", 1)[1] for line in (bundle / "MANIFEST.sha256").read_text().splitlines()}
    on_disk = {str(path.relative_to(bundle)) for path in bundle.rglob("*") if path.is_file()}
    on_disk -= {"MANIFEST.sha256", "MANIFEST.sha256.sig"}

    assert listed == on_disk
    assert {
        "image/appliance.tar",
        f"models/{DEMO_MODEL_NAME}/manifest.json",
        "wheels/client/requirements-3.9.txt",
        "wheels/client/requirements-3.13.txt",
        "systemd/appliance.container",
        "systemd/appliance.service",
        "systemd/appliance.sysusers.conf",
        "systemd/appliance.tmpfiles.conf",
        "monitoring/prometheus.yml",
        "monitoring/alerts.yml",
        "monitoring/alertmanager.yml",
        "monitoring/grafana-dashboard.json",
        "docs/operator-guide.md",
        "install-bundle",
        "gpu-smoke",
        "sbom/image.cdx.json",
        "sbom/client.cdx.json",
        "sbom/models.cdx.json",
    } <= listed
    # The format of coreutils: an administrator can run sha256sum -c by hand (the image's hash is
    # checked by the dry-run below; reading 4 GB twice is left out here).
    lines = [line for line in (bundle / "MANIFEST.sha256").read_text().splitlines() if "image/" not in line]
    assert run("sha256sum", "--check", "--quiet", input="\n".join(lines) + "\n", cwd=bundle).returncode == 0


def test_the_image_sbom_lists_the_lock_the_image_was_installed_with(bundle: Path, image):
    lock = (image.root / "opt/appliance/share/requirements.lock").read_text()
    sbom = json.loads((bundle / "sbom" / "image.cdx.json").read_text())
    models = json.loads((bundle / "sbom" / "models.cdx.json").read_text())
    pinned = set(re.findall(r"^([A-Za-z0-9._-]+)==([^ ;]+)", lock, re.MULTILINE))

    assert lock in {(REPO_ROOT / "images" / "locks" / f"{profile}.txt").read_text() for profile in ("cpu", "gpu")}
    assert {(c["name"], c["version"]) for c in sbom["components"]} == pinned
    assert [model["name"] for model in models["components"]] == [DEMO_MODEL_NAME]


def verify(bundle: Path, keyring: Path, state: Path) -> subprocess.CompletedProcess:
    return appliance_cli("bundle", "verify", bundle, "--keyring", keyring, "--state-dir", state, timeout=900)


def test_install_dry_run_verifies_and_changes_nothing(bundle: Path, keyring: Path, tmp_path: Path):
    verified = verify(bundle, keyring, tmp_path)
    # podman-classic: Debian bookworm's Podman (4.3) is older than the Quadlet unit needs.
    result = appliance_cli(
        "bundle", "install", bundle, "--dry-run", "--runtime", "podman-classic", "--state-dir", tmp_path
    )

    assert verified.returncode == 0, verified.stderr
    assert result.returncode == 0, result.stderr
    assert "verified" in verified.stdout and "nothing changed" in result.stdout


@pytest.mark.parametrize("victim", ["systemd/appliance.container", f"models/{DEMO_MODEL_NAME}/config.json"])
def test_a_tampered_file_is_refused_by_name(bundle: Path, keyring: Path, tmp_path: Path, victim: str):
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy, copy_function=os.link)  # links: the image is not copied again
    target = copy / victim
    text = target.read_bytes()
    target.unlink()  # break the link before writing
    target.write_bytes(text + b"\n# changed\n")

    result = verify(copy, keyring, tmp_path / "state")

    assert result.returncode == 1
    assert f"{copy / victim} changed since the bundle was made" in result.stderr


def test_a_missing_or_added_file_is_refused_by_name(bundle: Path, keyring: Path, tmp_path: Path):
    missing = tmp_path / "missing"
    shutil.copytree(bundle, missing, copy_function=os.link)
    (missing / "monitoring" / "alerts.yml").unlink()
    added = tmp_path / "added"
    shutil.copytree(bundle, added, copy_function=os.link)
    (added / "systemd" / "override.conf").write_text("[Service]\nExecStart=/bin/sh\n")

    refused_missing = verify(missing, keyring, tmp_path / "state")
    refused_added = verify(added, keyring, tmp_path / "state")

    assert (
        refused_missing.returncode == 1 and "missing from the bundle: monitoring/alerts.yml" in refused_missing.stderr
    )
    assert refused_added.returncode == 1 and "systemd/override.conf" in refused_added.stderr


def test_client_wheels_install_offline_without_torch(bundle: Path, tmp_path: Path):
    wheels = bundle / "wheels" / "client"
    venv = tmp_path / "client"
    run(sys.executable, "-m", "venv", venv).check_returncode()
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    offline = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_CONSTRAINT": ""}
    locked = f"requirements-{sys.version_info.major}.{sys.version_info.minor}.txt"

    installed = run(*pip, "--require-hashes", "--find-links", wheels, "-r", wheels / locked, env=offline, timeout=300)
    app = run(*pip, *wheels.glob("appliance-*.whl"), env=offline, timeout=300)
    check = run(venv / "bin" / "python", "-m", "pip", "check", env=offline)
    version = run(venv / "bin" / "appliance", "--version")
    jobs = run(venv / "bin" / "appliance", "jobs", "list", "--socket", tmp_path / "none.sock")
    tui = run(venv / "bin" / "appliance-tui", "--help")
    torch = run(venv / "bin" / "python", "-c", "import torch")

    assert installed.returncode == 0, installed.stderr
    assert app.returncode == 0 and check.returncode == 0, app.stderr + check.stdout
    assert version.stdout.strip() == f"appliance {__version__}"
    assert jobs.returncode == 1 and "none.sock" in jobs.stderr  # the client runs; no daemon there
    assert tui.returncode == 0, tui.stderr
    assert torch.returncode != 0
