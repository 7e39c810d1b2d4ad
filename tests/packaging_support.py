"""Helpers for the packaging checks (systemd/, images/, monitoring files): system tools, a signing key."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


def need_tool(name: str, package: str) -> str:
    """The path of a system program; skipped where it is absent, a failure in CI (.ci/run installs it)."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed (Debian package {package}; .ci/run installs it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class SigningKey:
    """A throwaway OpenPGP signing key: its gpg home (GNUPGHOME for images/bundle) and its exported public
    keyring (what the administrator installs on the box for install-bundle --keyring)."""

    home: Path
    keyring: Path
    uid: str


def make_signing_key(folder: Path, uid: str) -> SigningKey:
    home = folder / "gnupg"
    home.mkdir(mode=0o700, parents=True)
    gpg = ["gpg", "--batch", "--quiet", "--homedir", str(home)]
    subprocess.run([*gpg, "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never"], check=True)
    keyring = folder / "bundle-signing-key.gpg"
    keyring.write_bytes(subprocess.run([*gpg, "--export", uid], check=True, capture_output=True).stdout)
    return SigningKey(home, keyring, uid)
