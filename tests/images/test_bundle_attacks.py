"""A hostile bundle, or a hostile user on the box, against the verifier and the installer's check of its marker.

What test_bundle_verify.py does not try: mode bits the manifest cannot see (setuid, setgid), a folder above the
bundle (or above the key) that another user can change, a bundle swapped, rewritten or added to between the
verifier's pass and the install, and a keyring name that gpgv would look up in a gpg home of the caller's. Each
starts from the real signed bundle of conftest.py; the installer is this checkout's CLI, as the client runs it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.bundle.verify import BundleRefused, unverified, verify_bundle

REPO_ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
ONCE_EACH = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def copy_of(signed: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / "bundle"
    shutil.copytree(signed, copy, symlinks=True)
    return copy


def listed_files(bundle: Path) -> list[str]:
    return [line.split("  ", 1)[1] for line in (bundle / "MANIFEST.sha256").read_text().splitlines()]


def install_dry_run(bundle: Path, state: Path) -> subprocess.CompletedProcess:
    """The administrator's client, as install-bundle hands over to it (its first step is the marker's check)."""
    argv = [sys.executable, "-m", "appliance", "bundle", "install", str(bundle), "--state-dir", str(state), "--dry-run"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


# ----- what the manifest cannot see ---------------------------------------------------------------------------


@ONCE_EACH
@given(data=st.data(), bit=st.sampled_from([stat.S_ISUID, stat.S_ISGID, stat.S_ISUID | stat.S_ISGID]))
def test_a_listed_file_with_a_setuid_or_setgid_bit_is_refused(signed: Path, signing_key, tmp_path_factory, data, bit):
    bundle = copy_of(signed, tmp_path_factory.mktemp("suid"))
    name = data.draw(st.sampled_from(listed_files(bundle)))
    path = bundle / name
    path.chmod(stat.S_IMODE(path.stat().st_mode) | bit)

    with pytest.raises(BundleRefused) as refused:
        verify_bundle(bundle, signing_key.keyring, bundle.parent / "state")

    assert f"{path} has the setuid or setgid bit" in str(refused.value)
    assert not (bundle.parent / "state" / "verified").exists()


NAMES = st.binary(min_size=1, max_size=24).filter(lambda name: b"/" not in name and b"\0" not in name)
AWKWARD = st.sampled_from([b"a\nb", b"\xff\xfe", b"x\x1b[2Jy", b"back\\slash", b"nel\xc2\x85", b"\xe2\x80\xa8"])


@ONCE_EACH
@given(name=AWKWARD | NAMES, where=st.sampled_from(["", "docs", "models"]))
def test_an_added_entry_of_any_name_is_refused_in_one_printable_line(
    signed: Path, signing_key, tmp_path_factory, name, where
):
    """A name with a newline, escape sequence or bytes that are not UTF-8 is refused like any added file, and the
    refusal stays one line a terminal prints as it is (a newline in a name once split it, a non-UTF-8 byte made
    it unprintable)."""
    if name in (b".", b".."):
        return
    bundle = copy_of(signed, tmp_path_factory.mktemp("names"))
    folder = os.path.join(os.fsencode(bundle), os.fsencode(where)) if where else os.fsencode(bundle)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb"):
        pass

    with pytest.raises(BundleRefused) as refused:
        verify_bundle(bundle, signing_key.keyring, None)

    message = str(refused.value)
    assert message.startswith("refused: ") and message.isprintable(), ascii(message)
    message.encode("utf-8")  # stderr can print it


# ----- folders above the bundle and the key --------------------------------------------------------------------

MODES = st.integers(min_value=0o500, max_value=0o777).map(lambda mode: mode | 0o500)  # root reads, walks it


def others_can_rename(owner: int, mode: int) -> bool:
    return owner not in (0, os.geteuid()) or bool(mode & 0o022 and not mode & stat.S_ISVTX)


@ONCE_EACH
@given(
    owner=st.sampled_from([0, NOBODY]),
    mode=MODES,
    sticky=st.booleans(),
    depth=st.sampled_from([1, 2]),
)
def test_a_folder_above_the_bundle_that_another_user_can_change_is_refused(
    signed: Path, signing_key, tmp_path_factory, owner, mode, sticky, depth
):
    if owner != os.geteuid() and os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    top = tmp_path_factory.mktemp("above")
    weak = top / "weak"
    bundle = copy_of(signed, weak / "inner" if depth == 2 else weak)
    mode |= stat.S_ISVTX if sticky else 0
    os.chown(weak, owner, -1)
    weak.chmod(mode)

    if others_can_rename(owner, mode):
        with pytest.raises(BundleRefused) as refused:
            verify_bundle(bundle, signing_key.keyring, top / "state")
        assert f"refused: {weak} (a folder above the bundle) can be changed by another user" in str(refused.value)
        assert not (top / "state" / "verified").exists()
    else:
        verify_bundle(bundle, signing_key.keyring, top / "state")
        assert unverified(bundle, top / "state") is None


def test_a_swap_by_the_owner_of_a_folder_above_is_refused_before_it_can_happen(
    signed: Path, signing_key, tmp_path: Path
):
    """The attack itself: a user who owns a folder above a root-owned bundle waits for the verifier's pass, then
    puts a copy with the same signed manifest and one changed unit in its place. Refused at the verifier."""
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    theirs = tmp_path / "theirs"
    bundle = copy_of(signed, theirs)
    os.chown(theirs, NOBODY, NOBODY)

    with pytest.raises(BundleRefused, match=f"{theirs} \\(a folder above the bundle\\)"):
        verify_bundle(bundle, signing_key.keyring, tmp_path / "state")


# ----- between the verifier's pass and the install ------------------------------------------------------------


def swap_folder(bundle: Path) -> str:
    """The verified folder moved aside and a copy put in its place, the same manifest and signature, one unit changed."""
    aside = bundle.with_name("verified-original")
    bundle.rename(aside)
    shutil.copytree(aside, bundle, symlinks=True)
    with (bundle / "systemd" / "appliance.service").open("a") as unit:
        unit.write("ExecStartPre=/bin/sh -c 'id > /tmp/pwned'\n")
    return "MANIFEST.sha256"  # every entry is another inode now: the first file by name is named


def rewrite_in_place(bundle: Path) -> str:
    """The same inode, the same size: only the content (and so the change time) differs."""
    path = bundle / "release.json"
    text = path.read_bytes()
    with open(path, "r+b") as handle:
        handle.write(text.replace(b'"0.1.0"', b'"9.9.9"'))
    return "release.json"


def add_a_file(bundle: Path) -> str:
    (bundle / "systemd" / "appliance.service.d" / "zz-override.conf").write_text("[Service]\nUser=root\n")
    return "systemd/appliance.service.d/zz-override.conf"


def replace_by_rename(bundle: Path) -> str:
    unit = bundle / "systemd" / "appliance.container"
    replacement = unit.with_name(".new")
    replacement.write_bytes(unit.read_bytes())
    os.replace(replacement, unit)  # the same bytes, another inode
    return "systemd/appliance.container"


def chmod_a_file(bundle: Path) -> str:
    (bundle / "gpu-smoke").chmod(0o700)
    return "gpu-smoke"


CHANGES = {
    "the folder swapped for a copy": swap_folder,
    "a file rewritten in place": rewrite_in_place,
    "a file added": add_a_file,
    "a file replaced by a rename": replace_by_rename,
    "a file's mode changed": chmod_a_file,
}


@pytest.mark.parametrize("how", list(CHANGES))
def test_a_bundle_changed_after_its_verification_is_not_installed(how: str, signed: Path, signing_key, tmp_path: Path):
    bundle = copy_of(signed, tmp_path)
    state = tmp_path / "state"
    verify_bundle(bundle, signing_key.keyring, state)
    assert unverified(bundle, state) is None  # the untouched bundle passes: the check below can tell

    changed = CHANGES[how](bundle)
    refused = install_dry_run(bundle, state)

    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"refused: {bundle / changed} changed since {bundle} was verified" in refused.stderr
    assert "changed since" in refused.stderr and "run 'appliance bundle verify" in refused.stderr
    assert "install " not in refused.stdout and "upgrade " not in refused.stdout


def test_a_bundle_verified_before_another_one_is_not_installed(signed: Path, signing_key, tmp_path: Path):
    """The marker is one bundle's: verifying a second one takes it away from the first."""
    first, second = copy_of(signed, tmp_path / "a"), copy_of(signed, tmp_path / "b")
    verify_bundle(first, signing_key.keyring, tmp_path / "state")
    verify_bundle(second, signing_key.keyring, tmp_path / "state")

    assert unverified(first, tmp_path / "state") == f"{first} has not been verified"
    assert unverified(second, tmp_path / "state") is None


# ----- the key ---------------------------------------------------------------------------------------------------


def test_a_keyring_named_without_a_folder_is_the_file_that_was_checked(
    signed: Path, signing_key, tmp_path: Path, monkeypatch
):
    """gpgv reads `--keyring NAME` (no slash) from its gpg home, not from the current folder: a bundle signed by
    a stranger whose key sits in the caller's GNUPGHOME under that name must not pass for the right one."""
    from packaging_support import make_signing_key

    stranger = make_signing_key(tmp_path / "stranger", "Stranger <s@elsewhere.invalid>")
    bundle = copy_of(signed, tmp_path / "b")
    signature = bundle / "MANIFEST.sha256.sig"
    signature.unlink()
    subprocess.run(
        ["gpg", "--batch", "--quiet", "--homedir", str(stranger.home), "--detach-sign", "--output", str(signature)]
        + [str(bundle / "MANIFEST.sha256")],
        check=True,
    )
    home = tmp_path / "callers-gnupg"
    home.mkdir(mode=0o700)
    shutil.copy(stranger.keyring, home / "bundle-signing-key.gpg")
    shutil.copy(stranger.keyring, home / "trustedkeys.gpg")
    here = tmp_path / "keys"
    here.mkdir()
    shutil.copy(signing_key.keyring, here / "bundle-signing-key.gpg")  # the right key, in the current folder
    monkeypatch.setenv("GNUPGHOME", str(home))
    monkeypatch.chdir(here)

    with pytest.raises(BundleRefused, match="does not match its signature"):
        verify_bundle(bundle, Path("bundle-signing-key.gpg"), tmp_path / "state")
    assert not (tmp_path / "state" / "verified").exists()
    subprocess.run(["gpgconf", "--homedir", str(stranger.home), "--kill", "gpg-agent"], check=False)


@pytest.mark.parametrize("weak", ["key", "folder"])
def test_a_keyring_that_another_user_can_change_is_refused(weak: str, signed: Path, signing_key, tmp_path: Path):
    folder = tmp_path / "etc-appliance"
    folder.mkdir()
    keyring = folder / "bundle-signing-key.gpg"
    shutil.copy(signing_key.keyring, keyring)
    (keyring if weak == "key" else folder).chmod(0o666 if weak == "key" else 0o777)

    with pytest.raises(BundleRefused, match="can be changed by another user"):
        verify_bundle(signed, keyring, tmp_path / "state")
