"""A bundle vouches for nothing by itself: the administrator's verifier (`appliance bundle verify`, from the
client wheel) believes its manifest only under the signature of a key installed apart from the bundle, and
refuses, naming the file, otherwise; `appliance bundle install --dry-run` then checks the box.

The bundle here holds a stand-in image archive (no image build needed); everything else is real:
images/bundle, gpg, gpgv and the verifier."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from packaging_support import appliance_cli
from packaging_support import make_signing_key

REPO_ROOT = Path(__file__).resolve().parents[2]


def run(*argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(arg) for arg in argv], capture_output=True, text=True, **kwargs)


def test_the_sboms_travel_under_the_signed_manifest(signed: Path):
    listed = {line.split("  ", 1)[1] for line in (signed / "MANIFEST.sha256").read_text().splitlines()}
    image = json.loads((signed / "sbom" / "image.cdx.json").read_text())

    assert {"sbom/image.cdx.json", "sbom/client.cdx.json", "sbom/models.cdx.json"} <= listed
    assert [(c["name"], c["version"]) for c in image["components"]] == [("pyyaml", "6.0.2")]


def copy_of(bundle: Path, folder: Path) -> Path:
    copy = folder / "copy"
    shutil.copytree(bundle, copy)
    return copy


def dry_run(bundle: Path, keyring: Path) -> subprocess.CompletedProcess:
    state = bundle.parent / "install-state"
    return appliance_cli("bundle", "verify", bundle, "--keyring", keyring, "--state-dir", state)


def test_a_signed_bundle_verifies_against_the_installed_key(signed: Path, signing_key, tmp_path: Path):
    result = appliance_cli("bundle", "verify", signed, "--keyring", signing_key.keyring, "--state-dir", tmp_path)
    manifest = hashlib.sha256((signed / "MANIFEST.sha256").read_bytes()).hexdigest()

    assert result.returncode == 0, result.stderr
    assert f"verified {signed}: signature of MANIFEST.sha256 under {signing_key.keyring}" in result.stdout
    assert (tmp_path / "verified").read_text() == f"{manifest}  {signed}\n"


def test_a_changed_file_with_a_regenerated_manifest_is_refused(signed: Path, signing_key, tmp_path: Path):
    copy = copy_of(signed, tmp_path)
    unit = copy / "systemd" / "appliance.container"
    unit.write_text(unit.read_text().replace("User=appliance", "User=root"))
    lines = (copy / "MANIFEST.sha256").read_text().splitlines()
    digest = hashlib.sha256(unit.read_bytes()).hexdigest()
    lines = [
        f"{digest}  systemd/appliance.container" if line.endswith("  systemd/appliance.container") else line
        for line in lines
    ]
    (copy / "MANIFEST.sha256").write_text("\n".join(lines) + "\n")

    result = dry_run(copy, signing_key.keyring)

    assert result.returncode == 1
    assert "refused: MANIFEST.sha256 does not match its signature MANIFEST.sha256.sig" in result.stderr
    assert not (copy.parent / "install-state" / "verified").exists()


def test_a_changed_manifest_is_refused(signed: Path, signing_key, tmp_path: Path):
    copy = copy_of(signed, tmp_path)
    with (copy / "MANIFEST.sha256").open("a") as manifest:
        manifest.write("0" * 64 + "  extra\n")

    result = dry_run(copy, signing_key.keyring)

    assert result.returncode == 1 and "refused: MANIFEST.sha256 does not match" in result.stderr


def test_a_bundle_signed_by_another_key_is_refused(signed: Path, signing_key, tmp_path: Path):
    other = make_signing_key(Path(tempfile.mkdtemp(prefix="apk-", dir="/tmp")), "Someone else <x@y.invalid>")
    copy = copy_of(signed, tmp_path)
    signature = copy / "MANIFEST.sha256.sig"
    signature.unlink()
    gpg = ["gpg", "--batch", "--quiet", "--homedir", other.home, "--local-user", other.uid, "--detach-sign"]
    run(*gpg, "--output", signature, copy / "MANIFEST.sha256").check_returncode()
    run("gpgconf", "--homedir", other.home, "--kill", "gpg-agent")

    result = dry_run(copy, signing_key.keyring)

    assert result.returncode == 1 and "does not match its signature MANIFEST.sha256.sig" in result.stderr


def test_an_unsigned_bundle_or_a_box_without_the_key_is_refused(signed: Path, signing_key, tmp_path: Path):
    copy = copy_of(signed, tmp_path)
    (copy / "MANIFEST.sha256.sig").unlink()

    unsigned = dry_run(copy, signing_key.keyring)
    no_key = dry_run(signed, tmp_path / "absent.gpg")

    assert unsigned.returncode == 1 and "MANIFEST.sha256.sig is missing; the bundle is not signed" in unsigned.stderr
    assert no_key.returncode == 1 and f"no public key at {tmp_path / 'absent.gpg'}" in no_key.stderr


def test_the_signing_key_never_travels_in_the_bundle(signed: Path):
    for path in signed.rglob("*"):
        if path.is_file():
            assert b"PRIVATE KEY BLOCK" not in path.read_bytes(), path
    assert sorted(p.name for p in signed.glob("MANIFEST*")) == ["MANIFEST.sha256", "MANIFEST.sha256.sig"]


def test_bundle_refuses_to_write_without_a_signing_key(tmp_path: Path, signing_key):
    (tmp_path / "manifest.json").write_text("[]")
    run("tar", "-cf", tmp_path / "x.tar", "-C", tmp_path, "manifest.json").check_returncode()
    unsigned = run(REPO_ROOT / "images" / "bundle", "--out", tmp_path / "b", "--image-archive", tmp_path / "x.tar")
    unknown = run(
        REPO_ROOT / "images" / "bundle",
        *("--out", tmp_path / "b", "--image-archive", tmp_path / "x.tar", "--sign-key", "nobody@nowhere.invalid"),
        env={**os.environ, "GNUPGHOME": str(signing_key.home)},
    )

    assert unsigned.returncode == 2 and "--sign-key KEY is required" in unsigned.stderr
    assert unknown.returncode == 2 and "--sign-key nobody@nowhere.invalid: no secret key" in unknown.stderr
    assert not (tmp_path / "b").exists()


GETENT = """#!/bin/sh
# getent DATABASE KEY over the files beside this script: the line whose name or id is KEY.
awk -F: -v key="$2" '$1 == key || $3 == key { print; found = 1 } END { exit found ? 0 : 2 }' "$(dirname "$0")/$1"
"""


def box_with(tmp_path: Path, podman_version: str, passwd: str = "", group: str = "") -> dict[str, str]:
    """PATH with stand-ins for the box's podman and its user database (getent): the host boundary."""
    shims = tmp_path / "shims"
    shims.mkdir(parents=True)
    (shims / "podman").write_text(f"#!/bin/sh\necho {podman_version}\n")
    (shims / "getent").write_text(GETENT)
    (shims / "passwd").write_text(passwd)
    (shims / "group").write_text(group)
    for shim in ("podman", "getent"):
        (shims / shim).chmod(0o755)
    return {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}


def box_check(bundle: Path, keyring: Path, env: dict[str, str], runtime: str = "podman") -> subprocess.CompletedProcess:
    state = Path(env["PATH"].split(":")[0]).parent / "state"
    verified = appliance_cli("bundle", "verify", bundle, "--keyring", keyring, "--state-dir", state)
    assert verified.returncode == 0, verified.stderr
    return appliance_cli(
        "bundle", "install", bundle, "--dry-run", "--runtime", runtime, "--device", "gpu", "--state-dir", state, env=env
    )


def test_a_podman_older_than_the_quadlet_keys_need_is_refused(signed: Path, signing_key, tmp_path: Path):
    old = box_check(signed, signing_key.keyring, box_with(tmp_path / "old", "4.3.1"))
    new = box_check(signed, signing_key.keyring, box_with(tmp_path / "new", "5.2.0"))

    classic = box_check(signed, signing_key.keyring, box_with(tmp_path / "classic", "4.3.1"), "podman-classic")

    assert old.returncode == 1
    assert "Podman 4.3 is older than 5.0, which the Quadlet keys of appliance.container need" in old.stderr
    assert "--runtime podman-classic" in old.stderr
    assert new.returncode == 0, new.stderr
    assert "nothing changed" in new.stdout
    assert classic.returncode == 0 and "runtime podman-classic" in classic.stdout, classic.stderr


@pytest.mark.parametrize(
    ("passwd", "group", "message"),
    [
        ("postgres:x:10001:10001::/var/lib/postgresql:/bin/sh\n", "", "uid 10001 is taken by 'postgres'"),
        ("", "ldap:x:10001:\n", "gid 10001 is taken by group 'ldap'"),
        ("appliance:x:998:998::/:/bin/false\n", "", "user 'appliance' exists with uid 998, not 10001"),
    ],
)
def test_ids_the_image_needs_but_the_box_gave_away_are_refused(
    signed: Path, signing_key, tmp_path: Path, passwd: str, group: str, message: str
):
    result = box_check(signed, signing_key.keyring, box_with(tmp_path, "5.2.0", passwd, group))

    assert result.returncode == 1 and message in result.stderr, result.stderr


def test_the_appliance_user_already_there_with_its_ids_is_fine(signed: Path, signing_key, tmp_path: Path):
    passwd = "appliance:x:10001:10001::/var/lib/appliance:/usr/sbin/nologin\n"
    env = box_with(tmp_path, "5.2.0", passwd, "appliance:x:10001:\n")

    result = box_check(signed, signing_key.keyring, env)

    assert result.returncode == 0, result.stderr
