"""A newcomer's box for the tests that install the appliance: a Debian bookworm root made with mmdebstrap, used
through chroot in a private mount namespace (nothing stays mounted; each command gets its own).

The root is made once per machine and kept as a tarball in .test-cache/ (about two minutes to make, seconds to
unpack). This checkout and its Python are bound read-only at their own paths, so that the box's client is this
checkout's. No container can run here, so two programs of the box are stand-ins at the host boundary:
`systemctl` (no systemd runs as PID 1 here: `start` runs the daemon directly, as the appliance user, from the
code of the image the installed unit names) and `podman` (load, tag, rmi and exec over docker-archives).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packaging_support import hashed_lock, image_archive, need_tool, sbom_python

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE = REPO_ROOT / ".test-cache"
# What the guide says a box needs (gpgv, python3-venv, systemd's sysusers/tmpfiles), and what the image's base
# brings for the daemon that the stand-in systemctl runs directly on the box (libstdc++6, libgomp1 for torch).
PACKAGES = (
    "gpgv",
    "python3",
    "python3-venv",
    "systemd",
    "passwd",
    "sudo",
    "jq",
    "ca-certificates",
    "libstdc++6",
    "libgomp1",
)
STANDIN_DIR = "/usr/local/sbin"


def base_tarball() -> Path:
    """The cached bookworm root; made with mmdebstrap when missing (Debian's archive must be reachable)."""
    need_tool("mmdebstrap", "mmdebstrap")
    key = hashlib.sha256(",".join(PACKAGES).encode()).hexdigest()[:12]
    tarball = CACHE / f"newcomer-box-{key}.tar"
    if tarball.is_file():
        return tarball
    CACHE.mkdir(exist_ok=True)
    partial = tarball.with_suffix(f".{os.getpid()}.partial.tar")  # two runs at once each write their own
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    made = subprocess.run(
        ["mmdebstrap", "--quiet", "--variant=essential", f"--include={','.join(PACKAGES)}", "bookworm", str(partial)]
        + ([str(sources)] if sources.is_file() else []),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    partial.rename(tarball)
    return tarball


class Box:
    """One unpacked root; `run` executes a shell command in it as root."""

    def __init__(self, root: Path):
        self.root = root
        self.binds = sorted(
            {str(REPO_ROOT), os.path.realpath(REPO_ROOT / ".venv"), sys.prefix, sys.base_prefix}
            - {"/usr", "/usr/local"}
        )

    def path(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")

    def run(self, command: str, timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        mounts = [f"mount -t proc proc {self.root}/proc", f"mount --rbind /dev {self.root}/dev"]
        for path in self.binds:
            target = shlex.quote(f"{self.root}{path}")
            mounts += [f"mkdir -p {target}", f"mount --bind {shlex.quote(path)} {target}"]
            mounts.append(f"mount -o remount,bind,ro {target}")
        variables = {"PATH": f"{STANDIN_DIR}:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
        variables.update({"LANG": "C.UTF-8", **(env or {})})
        inner = shlex.join(
            ["chroot", str(self.root), "/usr/bin/env", "-i"] + [f"{k}={v}" for k, v in variables.items()]
        )
        script = " && ".join(mounts) + f" && exec {inner} /bin/sh -c {shlex.quote(command)}"
        return subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def processes(self) -> list[int]:
        """Every process whose root is this box (the daemon and its workers, wherever they were started)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.readlink(entry / "root") == str(self.root):
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def kill_everything(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.processes():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 20
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.2)


def unpack_box(folder: Path) -> Box:
    if os.geteuid() != 0:
        pytest.skip("the newcomer's box needs root (chroot, mount namespaces)")
    need_tool("unshare", "util-linux")
    root = folder / "box"
    root.mkdir()
    subprocess.run(["tar", "-xf", str(base_tarball()), "-C", str(root)], check=True)
    box = Box(root)
    box.path("/root").chmod(0o711)  # the bound interpreter lives under /root here; the appliance user runs it
    standins = box.path(STANDIN_DIR)
    standins.mkdir(parents=True, exist_ok=True)
    for name in ("systemctl", "podman"):
        text = (REPO_ROOT / "tests" / "standins" / name).read_text()
        (standins / name).write_text(f"#!{sys.executable}\n" + text)
        (standins / name).chmod(0o755)
    return box


def install_client(box: Box) -> None:
    """The administrator's client, /opt/appliance-client: this checkout's code, as its wheel would install it."""
    client = box.path("/opt/appliance-client/bin/appliance")
    client.parent.mkdir(parents=True)
    client.write_text(f'#!/bin/sh\nPYTHONPATH={REPO_ROOT} exec {sys.executable} -m appliance "$@"\n')
    client.chmod(0o755)


def admin_box(folder: Path, keyring: Path) -> Box:
    """A newcomer's box with the administrator's client and the bundle signing key the installer trusts."""
    box = unpack_box(folder)
    install_client(box)
    key = box.path("/etc/appliance/bundle-signing-key.gpg")
    key.parent.mkdir(parents=True)
    key.write_bytes(keyring.read_bytes())
    return box


def copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=True)


def source_layer(version: str) -> dict[str, bytes]:
    """The application's code as an image holds it, with its version: what the stand-ins run as the container."""
    files = {"opt/appliance/share/requirements.lock": hashed_lock("pyyaml==6.0.2").encode()}
    for package in ("appliance", "tui"):
        for path in sorted((REPO_ROOT / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                data = path.read_bytes()
                if path == REPO_ROOT / "appliance" / "__init__.py":
                    data = re.sub(rb'__version__ = "[^"]*"', f'__version__ = "{version}"'.encode(), data)
                files[f"opt/appliance/src/{path.relative_to(REPO_ROOT)}"] = data
    return files


def make_bundle(
    version: str, out: Path, signing_key, work: Path, model=None, client: Path | None = None, changes=None
) -> Path:
    """A real signed bundle (images/bundle) of this checkout's code as version VERSION, around a stand-in image
    archive; `model` is (name, data dir) or None; `client` a client wheelhouse, else a stand-in one; `changes`
    {path in the image: bytes} replaces files of the image's code (a release that fails, say)."""
    labels = {"org.opencontainers.image.version": version}
    archive = image_archive(
        work / f"image-{version}.tar",
        [{**source_layer(version), **(changes or {})}],
        f"localhost/appliance:{version}",
        labels,
    )
    if client is None:
        client = work / f"client-{version}"
        client.mkdir()
        (client / "requirements-3.9.txt").write_text(hashed_lock("pyyaml==6.0.2"))
        (client / f"appliance-{version}-py3-none-any.whl").write_bytes(b"PK")
    argv = [str(REPO_ROOT / "images" / "bundle"), "--out", str(out), "--image-archive", str(archive)]
    argv += ["--client-wheels", str(client), "--sign-key", signing_key.uid]
    if model is not None:
        argv += ["--model", model[0], "--data-dir", str(model[1])]
    made = subprocess.run(
        argv,
        env={**os.environ, "GNUPGHOME": str(signing_key.home), "APPLIANCE_SBOM_PYTHON": sbom_python()},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    return out
