"""images/bundle checks every input before it writes anything, and says what to change."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from packaging_support import hashed_lock
from packaging_support import image_archive
from packaging_support import sbom_python

REPO_ROOT = Path(__file__).resolve().parents[2]


def bundle(*args, env=None) -> subprocess.CompletedProcess:
    argv = [str(REPO_ROOT / "images" / "bundle"), *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, env=env)


def test_a_missing_image_archive_is_named(tmp_path: Path):
    result = bundle("--out", tmp_path / "b", "--image-archive", tmp_path / "nope.tar", "--dry-run")

    assert result.returncode == 2
    assert f"image archive {tmp_path / 'nope.tar'} does not exist" in result.stderr
    assert not (tmp_path / "b").exists()


def test_a_file_that_is_no_image_archive_is_refused(tmp_path: Path):
    archive = tmp_path / "image.tar"
    subprocess.run(["tar", "-cf", archive, "-C", REPO_ROOT, "README.md"], check=True)

    result = bundle("--out", tmp_path / "b", "--image-archive", archive, "--dry-run")

    assert result.returncode == 2
    assert "is not an image archive (no manifest.json)" in result.stderr


def test_an_unknown_model_is_named_with_the_store(tmp_path: Path, store_data_dir: Path, signing_key):
    lock = {"opt/appliance/share/requirements.lock": hashed_lock("pyyaml==6.0.2").encode()}
    archive = image_archive(tmp_path / "image.tar", [lock], "localhost/appliance:test", {})

    result = bundle(
        "--out",
        tmp_path / "b",
        "--image-archive",
        archive,
        "--model",
        "smollm2",
        "--data-dir",
        store_data_dir,
        "--dry-run",
    )
    named = bundle(
        "--out",
        tmp_path / "b",
        "--image-archive",
        archive,
        "--model",
        "smollm2-135m-instruct",
        "--data-dir",
        store_data_dir,
        "--sign-key",
        signing_key.uid,
        "--dry-run",
        env={**os.environ, "GNUPGHOME": str(signing_key.home), "APPLIANCE_SBOM_PYTHON": sbom_python()},
    )

    assert result.returncode == 2
    assert "model 'smollm2' is not in the store at" in result.stderr
    assert named.returncode == 0, named.stderr
    assert "dry run: every input is there; nothing written" in named.stdout
    assert not (tmp_path / "b").exists()


def test_an_existing_output_folder_is_never_overwritten(tmp_path: Path):
    (tmp_path / "b").mkdir()

    result = bundle("--out", tmp_path / "b", "--image-archive", tmp_path / "x.tar")

    assert result.returncode == 2 and "already exists" in result.stderr
