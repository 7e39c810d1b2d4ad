"""images/sbom lists exactly what the bundle installs: the lock read out of the image archive itself,
the client wheelhouse's locks, the models' files; and refuses an image without its lock or a lock
entry without hashes, naming the image, file and line.

The archive is a small docker-archive made here (the layout `podman save` writes); cyclonedx-py is
the real one (dev extra)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from packaging_support import hashed_lock
from packaging_support import image_archive
from packaging_support import sbom_python

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCK = "opt/appliance/share/requirements.lock"
TAG = "localhost/appliance:test"
LABELS = {"org.opencontainers.image.version": "9.8.7", "org.opencontainers.image.revision": "abc123"}


def sbom(*args) -> subprocess.CompletedProcess:
    argv = [sbom_python(), str(REPO_ROOT / "images" / "sbom"), *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def lock_pins(text: str) -> dict[tuple[str, str], set[str]]:
    """(name, version) -> the sha256 hashes of each entry of a lock."""
    pins: dict[tuple[str, str], set[str]] = {}
    for entry in text.replace("\\\n", " ").splitlines():
        if entry.strip() and not entry.lstrip().startswith("#"):
            name, version = entry.split(";")[0].split()[0].split("==")
            pins[(name, version)] = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", entry))
    return pins


def sbom_pins(bom: dict) -> dict[tuple[str, str], set[str]]:
    pins = {}
    for component in bom["components"]:
        assert component["purl"] == f"pkg:pypi/{component['name']}@{quote(component['version'])}"  # purl escapes +
        hashes = {h["content"] for ref in component["externalReferences"] for h in ref.get("hashes", [])}
        pins[(component["name"], component["version"])] = hashes
    return pins


def test_the_image_sbom_lists_the_lock_the_image_was_installed_with(tmp_path: Path):
    older = hashed_lock("pyyaml==6.0.1")
    installed = hashed_lock("pyyaml==6.0.2", "httpx==0.28.1", "torch==2.13.0+cpu")
    layers = [{"usr/bin/python3": b"\x7fELF"}, {LOCK: older.encode()}, {LOCK: installed.encode(), "etc/x": b""}]
    archive = image_archive(tmp_path / "image.tar", layers, TAG, LABELS)

    result = sbom("image", archive, tmp_path / "image.cdx.json")
    bom = json.loads((tmp_path / "image.cdx.json").read_text())

    assert result.returncode == 0, result.stderr
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.6"
    assert sbom_pins(bom) == lock_pins(installed)  # the top layer's lock, not the older one beneath
    root = bom["metadata"]["component"]
    properties = {p["name"]: p["value"] for p in root["properties"]}
    assert root["name"] == "appliance" and root["version"] == "9.8.7"
    assert properties["appliance:image"] == TAG
    assert properties["org.opencontainers.image.revision"] == "abc123"


def test_the_committed_gpu_lock_gives_one_hashed_component_per_package(tmp_path: Path):
    text = (REPO_ROOT / "images" / "locks" / "gpu.txt").read_text()
    archive = image_archive(tmp_path / "image.tar", [{LOCK: text.encode()}], TAG, LABELS)

    result = sbom("image", archive, tmp_path / "image.cdx.json")
    bom = json.loads((tmp_path / "image.cdx.json").read_text())

    assert result.returncode == 0, result.stderr
    assert sbom_pins(bom) == lock_pins(text)
    assert ("torch", "2.13.0") in sbom_pins(bom) and all(sbom_pins(bom).values())


def test_an_image_without_its_lock_is_named_with_the_path(tmp_path: Path):
    archive = image_archive(tmp_path / "image.tar", [{"usr/bin/python3": b""}], TAG, LABELS)

    result = sbom("image", archive, tmp_path / "image.cdx.json")

    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"images/sbom: image {TAG} ({archive}) holds no /{LOCK}: it was built before images/install kept its lock; "
        "rebuild it from this checkout"
    ]
    assert not (tmp_path / "image.cdx.json").exists()


def test_a_lock_deleted_by_a_later_layer_is_not_read(tmp_path: Path):
    deleted = {"opt/appliance/share/.wh.requirements.lock": b""}
    archive = image_archive(tmp_path / "image.tar", [{LOCK: hashed_lock("a==1").encode()}, deleted], TAG, LABELS)

    result = sbom("image", archive, tmp_path / "image.cdx.json")

    assert result.returncode == 1 and f"deletes /{LOCK}" in result.stderr


@pytest.mark.parametrize("bad", ["requests==2.32.5", "requests>=2 --hash=sha256:" + "0" * 64])
def test_a_lock_entry_without_a_pin_and_hash_is_refused_by_line(tmp_path: Path, bad: str):
    text = hashed_lock("pyyaml==6.0.2") + bad + "\n"
    archive = image_archive(tmp_path / "image.tar", [{LOCK: text.encode()}], TAG, LABELS)

    result = sbom("image", archive, tmp_path / "image.cdx.json")

    assert result.returncode == 1
    spec = bad.split(" --hash")[0]
    assert f"/{LOCK} of image {TAG} line 7: '{spec}' is not pinned with sha256 hashes" in result.stderr
    assert not (tmp_path / "image.cdx.json").exists()


def test_the_client_sbom_lists_every_python_s_packages_once_and_the_app_wheel(tmp_path: Path):
    wheelhouse = tmp_path / "client"
    wheelhouse.mkdir()
    (wheelhouse / "requirements-3.9.txt").write_text(hashed_lock("pydantic==2.13.5", "pyyaml==6.0.2"))
    (wheelhouse / "requirements-3.13.txt").write_text(hashed_lock("pydantic==2.14.3", "pyyaml==6.0.2"))
    wheel = wheelhouse / "appliance-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK not really a wheel")

    result = sbom("client", wheelhouse, tmp_path / "client.cdx.json")
    bom = json.loads((tmp_path / "client.cdx.json").read_text())

    assert result.returncode == 0, result.stderr
    assert set(sbom_pins(bom)) == {("pydantic", "2.13.5"), ("pydantic", "2.14.3"), ("pyyaml", "6.0.2")}
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert bom["metadata"]["component"]["hashes"] == [{"alg": "SHA-256", "content": digest}]


def test_the_models_sbom_lists_each_file_with_its_sha256(tmp_path: Path):
    files = {"config.json": {"bytes": 2, "sha256": "a" * 64}, "model.safetensors": {"bytes": 9, "sha256": "b" * 64}}
    (tmp_path / "store" / "tiny").mkdir(parents=True)
    (tmp_path / "store" / "tiny" / "manifest.json").write_text(json.dumps({"schema": 1, "files": files}))

    result = sbom("models", tmp_path / "store", tmp_path / "models.cdx.json", "tiny")
    bom = json.loads((tmp_path / "models.cdx.json").read_text())

    assert result.returncode == 0, result.stderr
    [model] = bom["components"]
    assert model["type"] == "machine-learning-model" and model["name"] == "tiny"
    listed = {c["name"]: c["hashes"][0]["content"] for c in model["components"]}
    assert listed == {name: meta["sha256"] for name, meta in files.items()}


def test_the_bundle_refuses_without_cyclonedx_and_says_how_to_get_it(tmp_path: Path, signing_key):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", bare], check=True)
    archive = image_archive(tmp_path / "image.tar", [{LOCK: hashed_lock("a==1").encode()}], TAG, LABELS)
    argv = [REPO_ROOT / "images" / "bundle", "--out", tmp_path / "b", "--image-archive", archive]
    argv += ["--sign-key", signing_key.uid, "--dry-run"]
    env = {"PATH": "/usr/bin:/bin", "APPLIANCE_SBOM_PYTHON": str(bare / "bin" / "python")}
    env["GNUPGHOME"] = str(signing_key.home)

    result = subprocess.run(list(map(str, argv)), capture_output=True, text=True, env=env)

    assert result.returncode == 2
    assert result.stderr.startswith(f"images/bundle: cyclonedx-bom is not installed for {bare}/bin/python; ")
    assert "make venv" in result.stderr and not (tmp_path / "b").exists()
