"""The box as the installer sees it: where each part goes, the container runtime, the units it writes, the
release records that make a rollback possible, and the job store's schema read without opening it for writing.

Each installed release keeps its image under its own version tag (localhost/appliance:VERSION), its models
in /var/lib/appliance-models/VERSION/ (files equal to the release before are hard links, not copies), and its
units and release.json in the state folder; /var/lib/appliance-models/current points at the release in use and
is flipped with one rename.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from appliance.durable import write_atomically
from appliance.errors import ApplianceError

DATA_DIR = Path("/var/lib/appliance")
MODELS_DIR = Path("/var/lib/appliance-models")
DOC_DIR = Path("/usr/share/doc/appliance")
SHIM = Path("/usr/local/bin/appliance")
CLIENT = Path("/opt/appliance-client/bin/appliance")
SOCKET = Path("/run/appliance/control.sock")
SYSUSERS = Path("/usr/lib/sysusers.d/appliance.conf")
TMPFILES = Path("/usr/lib/tmpfiles.d/appliance.conf")
QUADLET = Path("/etc/containers/systemd/appliance.container")
SERVICE = Path("/etc/systemd/system/appliance.service")
HARDENING = Path("/etc/systemd/system/appliance.service.d/hardening.conf")
UNIT = "appliance.service"
RUNTIMES = ("podman", "podman-classic", "docker")
QUADLET_PODMAN = (5, 0)  # StopTimeout, RunInit, PidsLimit, HealthOnFailure in Quadlet
REPOSITORY = "localhost/appliance"
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # an OCI tag; also one folder name, never '.' or '..'
_VERSION = re.compile(r"(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?")


class InstallError(ApplianceError):
    """The box cannot take this bundle, or a step failed; the message says what to change."""

    exit_code = 1


@dataclass(frozen=True)
class Release:
    """One installed version: what release.json of its bundle says, and how it was installed here."""

    version: str
    store_schema: int
    models: tuple[str, ...]
    runtime: str = "podman"
    device: str = "gpu"

    @property
    def image(self) -> str:
        return f"{REPOSITORY}:{self.version}"

    @staticmethod
    def read(path: Path) -> "Release":
        try:
            data = json.loads(path.read_text())
            release = Release(
                str(data["version"]),
                int(data["store_schema"]),
                tuple(data.get("models", ())),
                data.get("runtime", "podman"),
                data.get("device", "gpu"),
            )
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise InstallError(f"{path} is not a release record ({error}); the bundle or state is damaged") from None
        release.check(path)
        return release

    def check(self, path: Path) -> None:
        """Each field is what it names: the version is an image tag and a folder, each model a folder's name."""
        for what, value in [("version", self.version)] + [("model", model) for model in self.models]:
            if not isinstance(value, str) or not NAME.fullmatch(value):
                raise InstallError(
                    f"{path}: {what} {value!r} is not a plain name (letters, digits, '_', '.', '-', at most 128, "
                    "not starting with '.' or '-'): it names an image tag and a folder on the box"
                )
        if self.store_schema < 1 or self.runtime not in RUNTIMES or self.device not in ("gpu", "cpu"):
            raise InstallError(f"{path}: store_schema, runtime or device is not one this installer knows")

    def write(self, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomically(path, json.dumps({**asdict(self), "models": list(self.models)}, indent=2) + "\n", 0o644)


def version_key(version: str) -> tuple | None:
    """An order for versions like 0.2.0, 1.0rc1 (before 1.0); None for any other shape."""
    found = _VERSION.fullmatch(version)
    if not found:
        return None
    numbers = [int(part) for part in found.group(1).split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    stage = (0, ("a", "b", "rc").index(found.group(2)), int(found.group(3))) if found.group(2) else (1, 0, 0)
    return tuple(numbers), stage


def run(*argv: str, check: bool = True, timeout: float = 3600) -> subprocess.CompletedProcess:
    """A system command; a failure raises InstallError with its last lines."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise InstallError(f"{argv[0]} is not installed; this box needs it") from None
    if check and done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise InstallError(f"'{' '.join(argv[:3])} ...' failed ({done.returncode}): {' / '.join(tail)}")
    return done


def runtime_program(runtime: str) -> str:
    return "docker" if runtime == "docker" else "podman"


def pick_runtime(asked: str | None) -> str:
    """--runtime, else Podman with Quadlet (>= 5.0), else the classic unit on an older Podman, else Docker."""
    if asked is not None:
        if asked not in RUNTIMES:
            raise InstallError(f"--runtime is one of {', '.join(RUNTIMES)}, not '{asked}'")
        if shutil.which(runtime_program(asked)) is None:
            raise InstallError(f"--runtime {asked}: {runtime_program(asked)} is not installed")
        if asked == "podman" and podman_version() < QUADLET_PODMAN:
            raise InstallError(
                f"Podman {'.'.join(map(str, podman_version()))} is older than 5.0, which the Quadlet keys of "
                "appliance.container need (StopTimeout, RunInit, PidsLimit, HealthOnFailure); use "
                "--runtime podman-classic (a classic unit running podman) or --runtime docker"
            )
        return asked
    if shutil.which("podman"):
        return "podman" if podman_version() >= QUADLET_PODMAN else "podman-classic"
    if shutil.which("docker"):
        return "docker"
    raise InstallError("neither podman nor docker is installed; install one and run again")


def podman_version() -> tuple[int, ...]:
    text = run("podman", "version", "--format", "{{.Client.Version}}", check=False).stdout.strip()
    found = re.match(r"(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def pick_device(asked: str | None) -> str:
    """gpu when the box has an NVIDIA driver (or --device gpu), else cpu: a unit that asks for no GPU."""
    if asked is not None:
        if asked not in ("gpu", "cpu"):
            raise InstallError(f"--device is gpu or cpu, not '{asked}'")
        return asked
    return "gpu" if Path("/dev/nvidiactl").exists() else "cpu"


def render_units(bundle: Path, release: Release) -> dict[Path, str]:
    """The unit files for this release, runtime and device: {host path: text}."""
    if release.runtime == "podman":
        text = (bundle / "systemd" / "appliance.container").read_text()
        text = re.sub(r"(?m)^Image=.*$", f"Image={release.image}", text)
        if release.device == "cpu":
            text = re.sub(r"(?m)^# Every GPU through CDI.*\n^AddDevice=nvidia\.com/gpu=all\n", "", text)
        return {QUADLET: text}
    text = (bundle / "systemd" / "appliance.service").read_text()
    text = re.sub(rf"{re.escape(REPOSITORY)}:[^\s\\]+", release.image, text)
    gpus = "--gpus all " if release.runtime == "docker" else "--device nvidia.com/gpu=all "
    text = text.replace("--gpus all ", "" if release.device == "cpu" else gpus)
    if release.runtime == "docker":
        return {SERVICE: text, HARDENING: (bundle / "systemd" / "appliance.service.d" / "hardening.conf").read_text()}
    text = (
        text.replace("docker rm", "podman rm").replace("docker run", "podman run").replace("docker stop", "podman stop")
    )
    text = re.sub(r"(?m)^(Wants|PartOf)=docker\.service\n", "", text).replace("After=docker.service ", "After=")
    text = text.replace("(daemon, Docker)", "(daemon, Podman without Quadlet)")
    return {SERVICE: text}


def store_schema(data_dir: Path = DATA_DIR) -> tuple[int, int] | None:
    """(schema_version, readable_by) of the job store on disk, read-only; None when there is none yet."""
    path = data_dir / "appliance.db"
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        finally:
            db.close()
    except sqlite3.Error as error:
        raise InstallError(f"cannot read the job store {path} ({error}); check the disk before installing") from None
    version = int(meta.get("schema_version", 1))
    return version, int(meta.get("readable_by", version))


def check_store_readable(release: Release, data_dir: Path = DATA_DIR) -> None:
    """A release may run on the job store on disk only if its schema can read it (newer: it migrates up)."""
    found = store_schema(data_dir)
    if found is not None and release.store_schema < found[1]:
        raise InstallError(
            f"appliance {release.version} reads job store schema {release.store_schema}, and "
            f"{data_dir / 'appliance.db'} has schema {found[0]} that only schema {found[1]} or newer can read; "
            "install a release at least that new"
        )


def install_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Whole or not at all, durably (a power loss between two of the installer's writes leaves each file whole)."""
    write_atomically(path, text, mode)
    path.chmod(mode)  # the creation mode is masked by the caller's umask


def shim_text(runtime: str) -> str:
    program = runtime_program(runtime)
    return f"""#!/bin/sh
# appliance on the box (written by appliance bundle install). `appliance jobs ...` and `appliance bundle ...` run
# the administrator's client ({CLIENT}) as the caller, so `sudo -u alice appliance jobs list` is alice's;
# every other command (models, plan, config check, train, ...) needs the training stack, which is in the
# container: it runs there ({program} exec, as the appliance user), sees the container's paths only
# (/var/lib/appliance, /models), and needs root: sudo appliance models list. To check a job file of the
# host, ask the daemon: appliance jobs submit --dry-run FILE.
client={CLIENT}
case "${{1:-}}" in
  jobs|bundle|--version|-h|--help|"") [ -x "$client" ] && exec "$client" "$@" ;;
esac
if [ "$(id -u)" != 0 ]; then
  echo "appliance: '${{1:-}}' runs in the appliance container; run it with sudo (operators need only the client for 'appliance jobs')" >&2
  exit 1
fi
if [ -t 0 ] && [ -t 1 ]; then tty=-t; else tty=; fi
exec {program} exec -i $tty --user appliance appliance appliance "$@"
"""
