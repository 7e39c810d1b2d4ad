"""`appliance bundle verify DIR`: a bundle is exactly what its signer packed, checked before any of its code runs.

The signature of MANIFEST.sha256 is checked with gpgv (a copy read once, so the file checked is the file
parsed; the keyring by its absolute path, in a gpg home of its own), then the tree is walked without following
anything: every entry must be a directory that holds a listed file, or a regular file the manifest lists
without a setuid or setgid bit, owned by this user (or root) and writable by no one else, and so must every
folder above the bundle (a sticky one like /tmp aside) and the keyring: nobody else can swap anything between
this check and the install. Symlinks, devices, pipes, sockets, extra files and extra directories are refused by
name; then every listed file's sha256 is compared. A verified bundle gets a marker in the install state folder
holding the manifest's sha256 and the bundle's path (install-bundle refuses to run without it), and a stamp of
every entry's inode, size and change times, which the installer compares: a file replaced, changed or added
after the check refuses the install.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from appliance.durable import write_atomically
from appliance.errors import ApplianceError

MANIFEST = "MANIFEST.sha256"
SIGNATURE = "MANIFEST.sha256.sig"
DEFAULT_KEYRING = Path("/etc/appliance/bundle-signing-key.gpg")
DEFAULT_STATE_DIR = Path("/var/lib/appliance-install")
MARKER = "verified"
STAMP = "verified.stamp"
MAX_MANIFEST_BYTES = 16 * 2**20
# A name a terminal prints on one line as it is, and sha256sum lists without escaping: no control character
# (C0, DEL, C1, line separators), no backslash. A name of any other shape can never be in the manifest.
_PLAIN = r"[^\x00-\x1f\x7f-\x9f\u2028\u2029\\]+"
_LINE = re.compile(rf"([0-9a-f]{{64}})  ({_PLAIN})")
_NAME = re.compile(_PLAIN)
_CHUNK = 4 * 2**20


class BundleRefused(ApplianceError):
    """The bundle is not what its signer packed, or cannot be checked; the message names the file."""

    exit_code = 1


@dataclass(frozen=True)
class Verified:
    bundle: Path
    manifest_sha256: str
    files: int
    bytes: int


def marker_line(bundle: Path, manifest_sha256: str) -> str:
    return f"{manifest_sha256}  {bundle}\n"


def manifest_digest(bundle: Path) -> str:
    with open(bundle / MANIFEST, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def is_marked(bundle: Path, state_dir: Path = DEFAULT_STATE_DIR) -> bool:
    return unverified(bundle, state_dir) is None


def unverified(bundle: Path, state_dir: Path = DEFAULT_STATE_DIR) -> str | None:
    """None when `appliance bundle verify` passed this bundle and nothing in it changed since; else why not."""
    bundle = Path(os.path.realpath(bundle))
    try:
        if (state_dir / MARKER).read_text() != marker_line(bundle, manifest_digest(bundle)):
            return f"{bundle} has not been verified"
        stamped = json.loads((state_dir / STAMP).read_text())
    except (OSError, ValueError):
        return f"{bundle} has not been verified"
    now = _stamp(bundle)
    changed = set(stamped) ^ set(now) | {name for name in stamped if now.get(name) != stamped[name]}
    if not changed:
        return None
    # A file named before the folder it is in: an added or replaced file also changes its folder's times.
    first = min(changed, key=lambda name: (stat.S_ISDIR((now.get(name) or stamped[name])[2]), name))
    return f"{bundle / first} changed since {bundle} was verified ({len(changed)} entries differ)"


def verify_bundle(
    bundle: Path, keyring: Path = DEFAULT_KEYRING, state_dir: Path | None = DEFAULT_STATE_DIR
) -> Verified:
    """Check the bundle as the module docstring says; write the marker (unless state_dir is None)."""
    bundle, keyring = Path(os.path.realpath(bundle)), Path(os.path.realpath(keyring))
    if not bundle.is_dir():
        raise BundleRefused(f"{bundle} is not a directory; give the bundle's folder")
    _check_folders_above(bundle, "a folder above the bundle")
    manifest = _read_regular(bundle, MANIFEST, MAX_MANIFEST_BYTES)
    signature = _read_regular(bundle, SIGNATURE, 1 * 2**20)
    _check_signature(manifest, signature, keyring)
    listed = parse_manifest(manifest)
    _check_tree(bundle, set(listed))
    stamp = _stamp(bundle)  # before the hashes: a change while they are read shows at the install
    total = 0
    for name, digest in sorted(listed.items(), key=lambda item: os.lstat(bundle / item[0]).st_size):
        # Small files first: a changed unit or model file is named before the image is read.
        found, size = _sha256(bundle, name)
        if found != digest:
            raise BundleRefused(f"refused: {bundle / name} changed since the bundle was made (its sha256 differs)")
        total += size
    verified = Verified(bundle, hashlib.sha256(manifest).hexdigest(), len(listed), total)
    if state_dir is not None:
        _write_marker(state_dir, verified, stamp)
    return verified


def parse_manifest(text: bytes) -> dict[str, str]:
    """{relative path: sha256} from sha256sum's text format; any other line refuses the bundle."""
    listed: dict[str, str] = {}
    for number, raw in enumerate(text.decode("utf-8", errors="replace").split("\n"), 1):
        if not raw and number > 1:
            continue
        match = _LINE.fullmatch(raw)
        path = match.group(2) if match else ""
        parts = path.split("/")
        if not match or path.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise BundleRefused(f"refused: {MANIFEST} line {number} is not 'SHA256  RELATIVE/PATH': {raw[:80]!r}")
        if path in (MANIFEST, SIGNATURE) or path in listed:
            raise BundleRefused(f"refused: {MANIFEST} line {number} lists {path} twice or lists the manifest itself")
        listed[path] = match.group(1)
    if not listed:
        raise BundleRefused(f"refused: {MANIFEST} lists no file")
    return listed


def _read_regular(bundle: Path, name: str, limit: int) -> bytes:
    try:
        fd = os.open(bundle / name, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        what = "the bundle is not signed" if name == SIGNATURE else "this is not a bundle made by images/bundle"
        raise BundleRefused(f"refused: {bundle / name} is missing; {what}") from None
    except OSError as error:
        raise BundleRefused(f"refused: {bundle / name} cannot be opened as a file ({error.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise BundleRefused(f"refused: {bundle / name} is not a regular file of at most {limit} bytes")
        return handle.read(limit + 1)


def _check_signature(manifest: bytes, signature: bytes, keyring: Path) -> None:
    if not keyring.is_file():
        raise BundleRefused(
            f"no public key at {keyring}: install the bundle signing key you received apart from the bundle "
            f"(install -D -m 0644 KEY.gpg {keyring}), or give --keyring FILE"
        )
    _check_owner(keyring, os.stat(keyring), "the signing key")
    _check_folders_above(keyring, "a folder above the signing key")
    with tempfile.TemporaryDirectory(prefix="appliance-verify-") as scratch:
        (Path(scratch) / MANIFEST).write_bytes(manifest)
        (Path(scratch) / SIGNATURE).write_bytes(signature)
        # Its own home: no GNUPGHOME, trustedkeys.kbx or keyring name of the caller's gpg adds a key.
        argv = ["gpgv", "--homedir", scratch, "--keyring", str(keyring), SIGNATURE, MANIFEST]
        try:
            checked = subprocess.run(argv, cwd=scratch, capture_output=True, timeout=120)
        except FileNotFoundError:
            raise BundleRefused("gpgv is not installed (apt-get install gpgv); it checks the signature") from None
    if checked.returncode != 0:
        raise BundleRefused(
            f"refused: {MANIFEST} does not match its signature {SIGNATURE} under {keyring} "
            "(changed after signing, or signed by another key)"
        )


def _check_tree(bundle: Path, listed: set[str]) -> None:
    """Every entry is a listed regular file or a directory on the way to one; nothing else, nothing writable."""
    parents = {"/".join(name.split("/")[:end]) for name in listed for end in range(1, name.count("/") + 1)}
    _check_owner(bundle, os.lstat(bundle), "the bundle folder")
    for folder, directories, files in os.walk(bundle, followlinks=False):
        for name in sorted(directories + files):
            path = Path(folder) / name
            relative = path.relative_to(bundle).as_posix()
            if not _plain(name):
                raise BundleRefused(
                    f"refused: {ascii(str(path))} has a control character, a backslash or bytes that are not UTF-8 in "
                    f"its name; no file of a bundle is named so (added after the bundle was made)"
                )
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode):
                if relative not in parents:
                    raise BundleRefused(f"refused: {path} is a directory the manifest does not list a file in")
            elif not stat.S_ISREG(info.st_mode):
                raise BundleRefused(f"refused: {path} is a {_kind(info.st_mode)}; a bundle holds only regular files")
            elif relative not in listed and relative not in (MANIFEST, SIGNATURE):
                raise BundleRefused(f"refused: {path} is not in {MANIFEST} (added after the bundle was made)")
            _check_owner(path, info, relative)
    missing = sorted(name for name in listed if not (bundle / name).is_file())
    if missing:
        raise BundleRefused(f"refused: missing from the bundle: {' '.join(missing[:10])}")


def _plain(name: str) -> bool:
    try:
        name.encode("utf-8")  # a name that is not UTF-8 comes from os.walk with surrogates in it
    except UnicodeEncodeError:
        return False
    return _NAME.fullmatch(name) is not None


def _check_owner(path: Path, info: os.stat_result, what: str) -> None:
    if info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o022:
        raise BundleRefused(
            f"refused: {path} ({what}) can be changed by another user (owner uid {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):04o}); copy the bundle as the user who installs it (cp -r, umask 022)"
        )
    if stat.S_ISREG(info.st_mode) and info.st_mode & (stat.S_ISUID | stat.S_ISGID):
        raise BundleRefused(
            f"refused: {path} has the setuid or setgid bit (mode {stat.S_IMODE(info.st_mode):04o}); "
            "no file of a bundle carries one"
        )


def _check_folders_above(path: Path, what: str) -> None:
    """Every folder from / down to `path`'s own is root's or this user's, and no one else may rename in it
    (a sticky folder like /tmp lets others create, never move what is not theirs)."""
    for folder in reversed(path.parents):
        info = os.stat(folder)
        sticky = info.st_mode & stat.S_ISVTX
        if info.st_uid not in (0, os.geteuid()) or (info.st_mode & 0o022 and not sticky):
            raise BundleRefused(
                f"refused: {folder} ({what}) can be changed by another user (owner uid {info.st_uid}, mode "
                f"{stat.S_IMODE(info.st_mode):04o}), who could swap what is checked before it is installed; "
                "move it under a folder only root can write (/root, /srv)"
            )


def _stamp(bundle: Path) -> dict[str, list[int]]:
    """Each entry's identity and times: any replacement, write, chmod, chown or added name changes one."""
    stamp = {}
    for folder, directories, files in os.walk(bundle, followlinks=False):
        for name in ["", *directories, *files] if folder == str(bundle) else [*directories, *files]:
            path = Path(folder) / name
            info = os.lstat(path)
            stamp[path.relative_to(bundle).as_posix()] = [
                info.st_dev,
                info.st_ino,
                info.st_mode,
                info.st_uid,
                info.st_size,
                info.st_mtime_ns,
                info.st_ctime_ns,
            ]
    return stamp


def _kind(mode: int) -> str:
    kinds = {stat.S_ISLNK: "symbolic link", stat.S_ISCHR: "character device", stat.S_ISBLK: "block device"}
    kinds.update({stat.S_ISFIFO: "named pipe", stat.S_ISSOCK: "socket"})
    return next((name for test, name in kinds.items() if test(mode)), "special file")


def _sha256(bundle: Path, name: str) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    fd = os.open(bundle / name, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise BundleRefused(f"refused: {bundle / name} is not a regular file")
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _write_marker(state_dir: Path, verified: Verified, stamp: dict[str, list[int]]) -> None:
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, text in ((STAMP, json.dumps(stamp)), (MARKER, marker_line(verified.bundle, verified.manifest_sha256))):
        write_atomically(state_dir / name, text)
