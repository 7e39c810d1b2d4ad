"""Nothing of a bundle runs before the administrator's verifier passed it.

Each tampered copy carries an install-bundle that writes a canary file when it runs, and the copy goes through
the guide's own commands (`appliance bundle verify DIR && DIR/install-bundle`): a refused bundle leaves no
canary. The verifier is this checkout's (the client wheel's), the bundle a real signed one (conftest.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.bundle.verify import BundleRefused, parse_manifest

REPO_ROOT = Path(__file__).resolve().parents[2]
CANARY_SCRIPT = """#!/bin/sh
echo "bundle code ran: $0 $*" > {canary}
"""


def tampered(signed: Path, folder: Path, canary: Path) -> Path:
    """A copy of the bundle, ready to be changed. Its own install-bundle hands over to `client` (below), which
    writes CANARY.client: so a run of any bundle code shows, whichever part was changed."""
    copy = folder / "bundle"
    shutil.copytree(signed, copy, symlinks=True)
    return copy


def guide_install(bundle: Path, keyring: Path, state: Path, client: Path) -> subprocess.CompletedProcess:
    """The guide's two commands, chained as it prints them: the bundle's code runs only after a pass."""
    verify = f"PYTHONPATH={REPO_ROOT} {sys.executable} -m appliance bundle verify {bundle} --keyring {keyring}"
    script = f"{verify} --state-dir {state} && {bundle}/install-bundle --state-dir {state} --client {client}"
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    return tmp_path / "canary"


@pytest.fixture
def client(tmp_path: Path, canary: Path) -> Path:
    """The administrator's client as install-bundle finds it: here it only records that it was handed over to."""
    path = tmp_path / "client"
    path.write_text(f'#!/bin/sh\necho "client ran: $*" > {canary}.client\n')
    path.chmod(0o755)
    return path


def replace_install_bundle(bundle: Path, canary: Path) -> None:
    script = bundle / "install-bundle"
    script.write_text(CANARY_SCRIPT.format(canary=canary) + 'echo "signature verified"\n')
    script.chmod(0o755)


TAMPERINGS = {
    "a replaced install-bundle": (replace_install_bundle, "install-bundle changed since the bundle was made"),
    "an extra symlink": (
        lambda b, c: (b / "systemd" / "hooks.conf").symlink_to("/etc/shadow"),
        "systemd/hooks.conf is a symbolic link",
    ),
    "a listed file turned into a symlink": (
        lambda b, c: (b / "monitoring" / "alerts.yml").unlink() or (b / "monitoring" / "alerts.yml").symlink_to("x"),
        "monitoring/alerts.yml is a symbolic link",
    ),
    "an extra directory": (lambda b, c: (b / "hooks.d").mkdir(), "hooks.d is a directory the manifest does not list"),
    "an extra file": (
        lambda b, c: (b / "systemd" / "override.conf").write_text("[Service]\nExecStart=/bin/sh\n"),
        "systemd/override.conf is not in MANIFEST.sha256",
    ),
    "a named pipe": (lambda b, c: os.mkfifo(b / "docs" / "pipe"), "docs/pipe is a named pipe"),
    "a group-writable file": (
        lambda b, c: (b / "release.json").chmod(0o664),
        "release.json (release.json) can be changed by another user",
    ),
}


@pytest.mark.parametrize("how", list(TAMPERINGS))
def test_a_tampered_bundle_is_refused_before_any_of_its_code_runs(
    how: str, signed: Path, signing_key, tmp_path: Path, canary: Path, client: Path
):
    change, message = TAMPERINGS[how]
    bundle = tampered(signed, tmp_path, canary)
    change(bundle, canary)

    result = guide_install(bundle, signing_key.keyring, tmp_path / "state", client)

    assert result.returncode == 1, result.stdout + result.stderr
    assert message in result.stderr and "refused" in result.stderr, result.stderr
    assert not canary.exists() and not Path(f"{canary}.client").exists()
    assert not (tmp_path / "state" / "verified").exists()


def test_a_device_node_is_refused(signed: Path, signing_key, tmp_path: Path, canary: Path, client: Path):
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    bundle = tampered(signed, tmp_path, canary)
    os.mknod(bundle / "docs" / "mem", 0o600 | 0o020000, os.makedev(1, 1))

    result = guide_install(bundle, signing_key.keyring, tmp_path / "state", client)

    assert result.returncode == 1 and "docs/mem is a character device" in result.stderr
    assert not Path(f"{canary}.client").exists()


def test_a_verified_bundle_runs_install_bundle_which_hands_over_to_the_client(
    signed: Path, signing_key, tmp_path: Path, canary: Path, client: Path
):
    result = guide_install(signed, signing_key.keyring, tmp_path / "state", client)

    assert result.returncode == 0, result.stderr
    assert (
        Path(f"{canary}.client").read_text()
        == f"client ran: bundle install {signed} --state-dir {tmp_path / 'state'}\n"
    )


def test_install_bundle_without_the_marker_runs_nothing(signed: Path, signing_key, tmp_path: Path, client: Path):
    """An administrator who skips the verifier: the shipped install-bundle refuses, and so does a bundle
    verified earlier under another manifest (the marker holds the manifest's sha256 and the folder)."""
    state = tmp_path / "state"
    bare = subprocess.run(
        [signed / "install-bundle", "--state-dir", state, "--client", client], capture_output=True, text=True
    )
    other = tampered(signed, tmp_path, tmp_path / "unused")
    assert guide_install(other, signing_key.keyring, state, client).returncode == 0
    Path(f"{tmp_path / 'canary'}.client").unlink()
    with (other / "MANIFEST.sha256").open("a") as manifest:
        manifest.write("\n")
    stale = subprocess.run(
        [other / "install-bundle", "--state-dir", state, "--client", client], capture_output=True, text=True
    )

    for result in (bare, stale):
        assert result.returncode == 1 and "has not been verified; run 'appliance bundle verify" in result.stderr
    assert not Path(f"{tmp_path / 'canary'}.client").exists()


KINDS = st.sampled_from(["file", "directory", "symlink", "fifo", "hardlink-elsewhere"])
NAMES = st.text(alphabet="abcxyz-_.", min_size=1, max_size=8).filter(lambda name: name not in (".", ".."))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=KINDS, where=st.sampled_from(["", "systemd", "docs", "sbom"]), name=NAMES)
def test_any_extra_entry_anywhere_is_refused(signed: Path, signing_key, tmp_path_factory, kind, where, name):
    from appliance.bundle.verify import verify_bundle

    folder = tmp_path_factory.mktemp("extra")
    bundle = folder / "bundle"
    shutil.copytree(signed, bundle, symlinks=True)
    target = bundle / where / name
    if target.exists() or target.is_symlink():
        return
    if kind == "file":
        target.write_text("x")
    elif kind == "directory":
        target.mkdir()
    elif kind == "symlink":
        target.symlink_to("../release.json")
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        os.link(bundle / "release.json", target)

    with pytest.raises(BundleRefused) as refused:
        verify_bundle(bundle, signing_key.keyring, folder / "state")

    assert str(target) in str(refused.value)
    assert not (folder / "state" / "verified").exists()


BAD_PATHS = st.one_of(
    st.just("../etc/shadow"),
    st.just("/etc/shadow"),
    st.builds(lambda a, b: f"{a}/../{b}", NAMES, NAMES),
    st.builds(lambda a: f"{a}//x", NAMES),
    st.builds(lambda a, c: f"{a}{c}", NAMES, st.sampled_from(["\x00", "\x1b[2J", "\r", "\\n", "\x7f"])),
    st.builds(lambda a: f"./{a}", NAMES),
)


@settings(max_examples=50, deadline=None)
@given(path=BAD_PATHS)
def test_a_manifest_line_naming_anything_but_a_plain_relative_path_is_refused(path: str):
    text = f"{'0' * 64}  release.json\n{'1' * 64}  {path}\n".encode()

    with pytest.raises(BundleRefused) as refused:
        parse_manifest(text)

    assert "MANIFEST.sha256 line 2" in str(refused.value)
