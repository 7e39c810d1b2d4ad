"""The built image, opened without running it: `podman image mount` + `chroot` as its user.

CI's sandbox builds images but cannot run containers (its OCI runtime refuses setrlimit), so
the checks read the image's root filesystem and metadata directly. images/ci-build-check builds
the image and names it in APPLIANCE_TEST_IMAGE; without that variable these tests are skipped.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from packaging_support import hashed_lock, image_archive, make_signing_key, need_tool, podman, sbom_python

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class MountedImage:
    """An image's root filesystem on this host and its metadata (`podman image inspect`)."""

    tag: str
    root: Path
    inspect: dict
    config: dict = field(init=False)

    def __post_init__(self):
        self.config = self.inspect["Config"]

    @property
    def env(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.config.get("Env", []))

    def run(
        self, *argv: str, binds: dict[Path, str] | None = None, user: str = "appliance", timeout: float = 300
    ) -> subprocess.CompletedProcess:
        """argv inside the image root as `user`, with the image's environment and the given
        read-only bind mounts (host path -> path in the image), and what a container has: a fresh /tmp and an
        empty volume at each of the image's VOLUMEs, with its folder's owner and mode. All of it in a private
        mount namespace, so that nothing stays mounted and the image's files are never written (an overlay
        mount of the image is read-only; a vfs one is the image's own folder)."""
        ids = self.ids(user)
        mounts = [
            f"mount -t proc proc {self.root}/proc",
            f"mount --rbind /dev {self.root}/dev",
            f"mount -t tmpfs -o mode=1777 tmpfs {self.root}/tmp",
        ]
        for volume in self.config.get("Volumes") or {}:
            folder = self.root / volume.lstrip("/")
            owner = folder.stat()
            options = f"mode={owner.st_mode & 0o7777:o},uid={owner.st_uid},gid={owner.st_gid}"
            mounts.append(f"mount -t tmpfs -o {options} tmpfs {shlex.quote(str(folder))}")
        for source, target in (binds or {}).items():
            mounts.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(self.root) + target)}")
            mounts.append(f"mount -o remount,bind,ro {shlex.quote(str(self.root) + target)}")
        env = [f"{key}={value}" for key, value in self.env.items()] + [f"HOME={self.config.get('WorkingDir', '/')}"]
        command = ["chroot", f"--userspec={ids}", str(self.root), "/usr/bin/env", "-i", *env, *argv]
        script = " && ".join(mounts + ["exec " + shlex.join(command)])
        return subprocess.run(
            ["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=timeout
        )

    def passwd_entry(self, name: str) -> list[str]:
        for line in (self.root / "etc" / "passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == name:
                return fields
        raise AssertionError(f"no user '{name}' in the image's /etc/passwd")

    def ids(self, user: str) -> str:
        fields = self.passwd_entry(user)
        return f"{fields[2]}:{fields[3]}"


def _open(tag: str) -> MountedImage:
    inspect = json.loads(podman("image", "inspect", tag).stdout)[0]
    root = Path(podman("image", "mount", tag).stdout.strip())
    return MountedImage(tag, root, inspect)


@pytest.fixture(scope="session")
def image() -> MountedImage:
    tag = os.environ.get("APPLIANCE_TEST_IMAGE")
    if not tag:
        pytest.skip("image checks run from images/ci-build-check, which builds the image (root, podman, mmdebstrap)")
    opened = _open(tag)
    yield opened
    podman("image", "unmount", tag, check=False)


@pytest.fixture(scope="session")
def base_image(image: MountedImage) -> dict:
    tag = os.environ["APPLIANCE_TEST_BASE_IMAGE"]
    return json.loads(podman("image", "inspect", tag).stdout)[0]


@pytest.fixture(scope="session")
def signing_key():
    # A short folder: gpg-agent's socket path must stay under 108 bytes.
    folder = Path(tempfile.mkdtemp(prefix="apk-", dir="/tmp"))
    key = make_signing_key(folder, "Appliance bundles (test) <bundles@appliance.invalid>")
    yield key
    subprocess.run(["gpgconf", "--homedir", str(key.home), "--kill", "gpg-agent"], check=False)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def signed(signing_key, tmp_path_factory) -> Path:
    """A real bundle (images/bundle, gpg) around a stand-in image archive of version 0.1.0 and a stand-in client
    wheelhouse: every check of the bundle's files, none of an image build."""
    need_tool("gpgv", "gpgv")
    inputs = tmp_path_factory.mktemp("inputs")
    lock = {"opt/appliance/share/requirements.lock": hashed_lock("pyyaml==6.0.2").encode()}
    labels = {"org.opencontainers.image.version": "0.1.0"}
    image = image_archive(inputs / "image.tar", [lock], "localhost/appliance:test", labels)
    client = inputs / "client"
    client.mkdir()
    (client / "requirements-3.9.txt").write_text(hashed_lock("pyyaml==6.0.2"))
    (client / "appliance-0.1.0-py3-none-any.whl").write_bytes(b"PK")
    out = tmp_path_factory.mktemp("bundle") / "appliance-bundle"
    made = subprocess.run(
        [str(REPO_ROOT / "images" / "bundle"), "--out", str(out), "--image-archive", str(image)]
        + ["--client-wheels", str(client), "--sign-key", signing_key.uid],
        env={**os.environ, "GNUPGHOME": str(signing_key.home), "APPLIANCE_SBOM_PYTHON": sbom_python()},
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    return out
