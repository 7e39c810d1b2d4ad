"""Install, upgrade, roll back and uninstall the appliance on the box, each one command, as root.

An install of a verified bundle over a running one is an upgrade: the new image is loaded and tagged with
its version and its models copied beside the old ones while jobs still run; then the jobs are drained
(drain.py), the service stops, the models' `current` link is flipped with one rename, the units are
rewritten for the new image, the service starts (the daemon migrates the job store, keeping a copy of the
old one) and every drained job resumes. The release before keeps its image tag, models and units, which is
all a rollback needs. A swap that fails puts the release before back; one killed half-way leaves a journal
(state/switching) that status shows and a rollback undoes. Uninstall removes units, shim and images and keeps the data unless told to purge it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from appliance.bundle import box, drain
from appliance.bundle.box import InstallError, Release
from appliance.bundle.verify import unverified
from appliance.service.client import DaemonUnreachable

RELEASES = "releases"
LOCK = "lock"
SWITCHING = "switching"  # "TARGET FROM WAS-ACTIVE": a swap began and has not been recorded as done
READY_TIMEOUT_SECONDS = 900.0


@dataclass(frozen=True)
class Options:
    state_dir: Path
    runtime: str | None = None
    device: str | None = None
    drain_timeout: float = 900.0
    dry_run: bool = False
    downgrade: bool = False  # install a release older than the one in use (rollback is the usual way back)


def current(state_dir: Path) -> Release | None:
    return _pointer(state_dir, "current")


def previous(state_dir: Path) -> Release | None:
    return _pointer(state_dir, "previous")


def install(bundle: Path, options: Options, say=print) -> Release:
    """A first install, or an upgrade (or reinstall) over the release in use; one at a time."""
    with _exclusive(options, "install"):
        return _install(bundle, options, say)


def _install(bundle: Path, options: Options, say) -> Release:
    bundle = Path(os.path.realpath(bundle))
    reason = unverified(bundle, options.state_dir)
    if reason is not None:
        raise InstallError(f"refused: {reason}; run 'appliance bundle verify {bundle}' first")
    release = Release.read(bundle / "release.json")
    installed = current(options.state_dir)
    if installed is not None and not options.downgrade:
        _check_not_older(release, installed, previous(options.state_dir))
    release = replace(release, runtime=box.pick_runtime(options.runtime), device=box.pick_device(options.device))
    box.check_store_readable(release)
    _check_ids(bundle)
    say(
        f"{'upgrade ' + installed.version + ' -> ' if installed else 'install '}{release.version}: runtime "
        f"{release.runtime}, device {release.device}, image {release.image}, models {', '.join(release.models) or 'none'}"
    )
    if options.dry_run:
        say("dry run: the bundle is verified and this box has what it needs; nothing changed")
        return release
    _need_root()
    program = box.runtime_program(release.runtime)
    _system_user(bundle)
    _load_image(bundle, release, program, say)
    _stage_models(bundle, release, installed)
    _switch(options, release, installed, say, lambda: _install_files(bundle, release))
    _remember(options.state_dir, release, installed)
    (options.state_dir / SWITCHING).unlink(missing_ok=True)
    _prune(options.state_dir, program, keep={release.version, installed.version if installed else ""})
    if installed is None:
        start = "systemctl start" if release.runtime == "podman" else "systemctl enable --now"
        say(f"installed {release.version}. Next: {start} {box.UNIT}; usermod -aG appliance OPERATOR (then a new login)")
    return release


def rollback(options: Options, say=print) -> Release:
    """Back to the release before the one in use: its image tag, models and units are still here."""
    with _exclusive(options, "rollback"):
        return _rollback(options, say)


def _rollback(options: Options, say) -> Release:
    now, before = current(options.state_dir), previous(options.state_dir)
    unfinished = interrupted(options.state_dir)
    if unfinished is not None and now is not None:
        return _undo(options, now, unfinished, say)
    if now is None or before is None:
        raise InstallError(
            f"no release before the one in use is recorded in {options.state_dir}; nothing to roll back to"
        )
    box.check_store_readable(before)
    program = box.runtime_program(before.runtime)
    if box.run(program, "image", "exists", before.image, check=False).returncode != 0:
        raise InstallError(f"the image {before.image} of release {before.version} is gone; install its bundle again")
    if not (box.MODELS_DIR / before.version).is_dir():
        raise InstallError(f"the models of release {before.version} ({box.MODELS_DIR / before.version}) are gone")
    say(f"rollback {now.version} -> {before.version}")
    if options.dry_run:
        return before
    _need_root()
    units = _release_dir(options.state_dir, before.version) / "units"
    _switch(options, before, now, say, lambda: _restore_units(units))
    _remember(options.state_dir, before, now)
    (options.state_dir / SWITCHING).unlink(missing_ok=True)
    return before


def interrupted(state_dir: Path) -> tuple[str, str, bool] | None:
    """(target, from, whether the service ran) of an install or rollback that stopped half-way (kill -9, power
    loss); None when none did."""
    try:
        words = (state_dir / SWITCHING).read_text(errors="replace").split()
    except FileNotFoundError:
        return None
    if len(words) != 3:  # cut short by a power loss: assume the service ran, so that it runs again
        return ("an unknown release", "-", True)
    return words[0], words[1], words[2] != "inactive"


def _undo(options: Options, now: Release, unfinished: tuple[str, str], say) -> Release:
    """A swap to unfinished[0] stopped half-way (its models, units or daemon may be in place): the release the
    records name as in use goes back in place and runs, with every drained job; the records stay as they are."""
    box.check_store_readable(now)
    say(f"the swap to {unfinished[0]} did not finish; returning to {now.version}, the release in use before it")
    if options.dry_run:
        return now
    _need_root()
    units = _release_dir(options.state_dir, now.version) / "units"
    _switch(options, now, None, say, lambda: _restore_units(units))
    (options.state_dir / SWITCHING).unlink(missing_ok=True)
    return now


def uninstall(options: Options, purge: bool, say=print) -> None:
    """Stop and remove units, shim, documentation and every release's image; keep the data unless purge."""
    with _exclusive(options, "uninstall" + (" --purge" if purge else "")):
        _uninstall(options, purge, say)


def _uninstall(options: Options, purge: bool, say) -> None:
    releases = [Release.read(path) for path in sorted((options.state_dir / RELEASES).glob("*/release.json"))]
    box.run("systemctl", "disable", "--now", box.UNIT, check=False)  # the stop chain checkpoints running jobs
    box.run("systemctl", "stop", box.UNIT, check=False)
    if box.run("systemctl", "is-active", "--quiet", box.UNIT, check=False).returncode == 0:
        # Units, images (and with --purge the data) pulled from under a daemon that still runs: refuse first.
        raise InstallError(
            f"{box.UNIT} did not stop, so nothing was removed: see journalctl -u {box.UNIT}, stop it "
            f"(systemctl stop {box.UNIT}), then run the uninstall again"
        )
    for path in (box.QUADLET, box.SERVICE, box.HARDENING, box.SYSUSERS, box.TMPFILES, box.SHIM):
        path.unlink(missing_ok=True)
    shutil.rmtree(box.HARDENING.parent, ignore_errors=True)
    shutil.rmtree(box.DOC_DIR, ignore_errors=True)
    box.run("systemctl", "daemon-reload", check=False)
    for release in releases:
        box.run(box.runtime_program(release.runtime), "rmi", "--force", release.image, check=False)
    for name in ("current", "previous", RELEASES, drain.DRAINED, SWITCHING, "verified", "verified.stamp"):
        target = options.state_dir / name
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink(missing_ok=True)
    kept = f"{box.DATA_DIR} and {box.MODELS_DIR}"
    if purge:
        shutil.rmtree(box.DATA_DIR, ignore_errors=True)
        shutil.rmtree(box.MODELS_DIR, ignore_errors=True)
        kept = "nothing (purged)"
    say(
        f"uninstalled {', '.join(r.version for r in releases) or 'nothing recorded'}; kept {kept}; the client in "
        f"{box.CLIENT.parent.parent} stays (rm -rf it when done)"
    )


# ----- steps ---------------------------------------------------------------------------------------


def _switch(options: Options, target: Release, running: Release | None, say, write_units) -> None:
    """Drain, stop, flip models and units to `target`, start, resume: the moment jobs wait. Any step of it that
    fails (a unit that cannot be written on a full disk, a daemon that does not start) puts `running` back."""
    active = box.run("systemctl", "is-active", "--quiet", box.UNIT, check=False).returncode == 0
    earlier = interrupted(options.state_dir)  # one that stopped half-way may have stopped the service
    ran = active or (earlier is not None and earlier[2])
    state = "active" if ran else "inactive"
    box.install_file(
        options.state_dir / SWITCHING, f"{target.version} {running.version if running else '-'} {state}\n", 0o600
    )
    started = stopped = time.monotonic()
    if active:
        _drain_and_stop(options, running, say)
        stopped = time.monotonic()
        say(f"service stopped {stopped - started:.1f} s after the drain began")
    restart = ran or bool(drain.pending(options.state_dir))
    try:
        _put_in_place(target, running, write_units)
        if restart:
            _start(options, target, stopped, say)
    except (InstallError, DaemonUnreachable, OSError) as error:
        if running is None:
            raise
        _return_to(options, running, target, error, say, restart)


def _drain_and_stop(options: Options, running: Release | None, say) -> None:
    try:
        drained = drain.drain(box.SOCKET, options.drain_timeout, options.state_dir, say)
    except DaemonUnreachable as error:  # hung, or its socket gone: no drain, but the stop chain still checkpoints
        say(f"no drain: the daemon does not answer ({error.__class__.__name__}); the stop checkpoints running jobs")
        drained = None
    if drained is not None:
        say(
            f"drained {len(drained.job_ids)} job(s) in {drained.seconds:.1f} s"
            + (
                f"; still running past {options.drain_timeout:g} s (the stop checkpoints them): "
                f"{' '.join(drained.still_running)}"
                if drained.still_running
                else ""
            )
        )
    try:
        box.run("systemctl", "stop", box.UNIT)
    except InstallError as error:  # still the release in use: its jobs go on where they were
        resumed = drain.resume(box.SOCKET, options.state_dir, READY_TIMEOUT_SECONDS, say)
        version = running.version if running else "the release in use"
        (options.state_dir / SWITCHING).unlink(missing_ok=True)  # nothing was swapped
        raise InstallError(
            f"{error}; nothing was swapped, {version} runs on and its {len(resumed)} job(s) resumed"
        ) from None


def _put_in_place(target: Release, running: Release | None, write_units) -> None:
    _flip_models(target.version)
    write_units()
    box.run("systemctl", "daemon-reload")
    if running is not None and running.runtime != target.runtime:
        (box.QUADLET if running.runtime == "podman" else box.SERVICE).unlink(missing_ok=True)


def _start(options: Options, target: Release, stopped: float, say) -> None:
    box.run("systemctl", "start", box.UNIT)
    resumed = drain.resume(box.SOCKET, options.state_dir, READY_TIMEOUT_SECONDS, say)
    say(
        f"appliance {target.version} is running; {len(resumed)} job(s) resumed; the control API was down "
        f"{time.monotonic() - stopped:.1f} s"
    )


def _return_to(options: Options, running: Release, failed: Release, error: Exception, say, restart: bool) -> None:
    """The new release did not go in place or did not start: the one that ran before runs again (if it ran), with
    its jobs, and the records still name it; then the failure is raised. Its image, models and units were never
    touched."""
    say(f"appliance {failed.version} did not start ({error}); returning to {running.version}")
    box.run("systemctl", "stop", box.UNIT, check=False)
    # The failed release's restarts spent the unit's start limit: systemd refuses the next start until this.
    box.run("systemctl", "reset-failed", box.UNIT, check=False)
    units = _release_dir(options.state_dir, running.version) / "units"
    try:
        _put_in_place(running, failed, lambda: _restore_units(units))
        if restart:
            _start(options, running, time.monotonic(), say)
    except (InstallError, DaemonUnreachable, OSError) as again:
        raise InstallError(
            f"appliance {failed.version} did not start ({error}), and {running.version} did not start again "
            f"({again}): see journalctl -u {box.UNIT}; if the job store was migrated, the copy from before is "
            f"{box.DATA_DIR / 'appliance.db'}.schema-N"
        ) from None
    (options.state_dir / SWITCHING).unlink(missing_ok=True)  # back where it began: nothing is half-done
    raise InstallError(
        f"appliance {failed.version} did not start ({error}); {running.version} "
        + ("runs again and every drained job resumed" if restart else "is in place again (not started, as before)")
        + f"; see journalctl -u {box.UNIT} for why, then install {failed.version} again or not"
    )


def _load_image(bundle: Path, release: Release, program: str, say) -> None:
    loaded = box.run(program, "load", "--input", str(bundle / "image" / "appliance.tar")).stdout
    names = [line.split(":", 1)[1].strip() for line in loaded.splitlines() if line.startswith("Loaded image")]
    if not names:
        raise InstallError(f"{program} load printed no image name for {bundle / 'image' / 'appliance.tar'}")
    if names[0] != release.image:
        box.run(program, "tag", names[0], release.image)
    say(f"  image {release.image} loaded")


def _stage_models(bundle: Path, release: Release, installed: Release | None) -> None:
    """The release's models in MODELS_DIR/VERSION: files equal to the release in use are hard links."""
    target = box.MODELS_DIR / release.version
    staging = box.MODELS_DIR / f".{release.version}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        _copy_models(bundle, release, installed, staging)
    except OSError as error:  # a full disk, an I/O error: nothing half-copied stays to fill it further
        shutil.rmtree(staging, ignore_errors=True)
        raise InstallError(
            f"copying the models of {release.version} failed at {error.filename2 or error.filename}: "
            f"{error.strerror or error}; nothing was changed: free space in {box.MODELS_DIR} (the new release's "
            "models are copied beside the ones in use) and run the install again"
        ) from None
    box.run("chown", "-R", "root:appliance", str(staging))
    box.run("chmod", "-R", "u=rwX,g=rX,o=", str(staging))
    if target.exists() and target != (box.MODELS_DIR / "current").resolve():
        shutil.rmtree(target)
    if not target.exists():
        os.rename(staging, target)
    else:  # a reinstall of the release in use: its folder stays in place
        shutil.rmtree(staging)


def _copy_models(bundle: Path, release: Release, installed: Release | None, staging: Path) -> None:
    old = box.MODELS_DIR / installed.version if installed else None
    for model in release.models:
        source = bundle / "models" / model
        for path in sorted(source.rglob("*")):
            destination = staging / model / path.relative_to(source)
            if path.is_dir():
                destination.mkdir(parents=True, exist_ok=True)
                continue
            destination.parent.mkdir(parents=True, exist_ok=True)
            twin = old / model / path.relative_to(source) if old else None
            if twin is not None and twin.is_file() and _same_file(path, twin):
                os.link(twin, destination)
            else:
                shutil.copyfile(path, destination)


def _same_file(a: Path, b: Path) -> bool:
    import filecmp

    return a.stat().st_size == b.stat().st_size and filecmp.cmp(a, b, shallow=False)


def _flip_models(version: str) -> None:
    """MODELS_DIR/current -> VERSION in one rename; models of an install before releases move into their own."""
    box.MODELS_DIR.mkdir(parents=True, exist_ok=True)
    link = box.MODELS_DIR / "current"
    temporary = box.MODELS_DIR / ".current.new"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(version)
    os.replace(temporary, link)


def _system_user(bundle: Path) -> None:
    """The appliance user, group and folders (sysusers.d, tmpfiles.d): the models' group must exist before they
    are staged. Nothing here disturbs a running release (the same ids, the same folders)."""
    box.install_file(box.SYSUSERS, (bundle / "systemd" / "appliance.sysusers.conf").read_text())
    box.install_file(box.TMPFILES, (bundle / "systemd" / "appliance.tmpfiles.conf").read_text())
    box.run("systemd-sysusers", "appliance.conf")
    box.run("systemd-tmpfiles", "--create", "appliance.conf")


def _install_files(bundle: Path, release: Release) -> None:
    for path, text in box.render_units(bundle, release).items():
        box.install_file(path, text)
    if release.runtime != "docker":
        shutil.rmtree(box.HARDENING.parent, ignore_errors=True)
    docs = box.DOC_DIR.with_name(".appliance.new")
    shutil.rmtree(docs, ignore_errors=True)
    docs.mkdir(parents=True)
    shutil.copy(bundle / "docs" / "operator-guide.md", docs)
    monitoring = ("prometheus.yml", "alerts.yml", "alertmanager.yml", "grafana-dashboard.json")
    for name in monitoring + ("prometheus.default", "prometheus-alertmanager.default"):
        shutil.copy(bundle / "monitoring" / name, docs)
    shutil.copy(bundle / "gpu-smoke", docs)
    for folder, into in (("wheels/client", "client-wheels"), ("examples", "examples"), ("sbom", "sbom")):
        shutil.copytree(bundle / folder, docs / into)
    shutil.rmtree(box.DOC_DIR, ignore_errors=True)
    os.rename(docs, box.DOC_DIR)
    box.install_file(box.SHIM, box.shim_text(release.runtime), mode=0o755)


def _restore_units(units: Path) -> None:
    for path in (box.QUADLET, box.SERVICE, box.HARDENING):
        saved = units / path.relative_to("/")
        if saved.is_file():
            box.install_file(path, saved.read_text())
        else:
            path.unlink(missing_ok=True)


def _remember(state_dir: Path, release: Release, before: Release | None) -> None:
    """releases/VERSION/{release.json,units/}, and the current and previous pointers."""
    folder = _release_dir(state_dir, release.version)
    shutil.rmtree(folder / "units", ignore_errors=True)
    for path in (box.QUADLET, box.SERVICE, box.HARDENING):
        if path.is_file():
            box.install_file(folder / "units" / path.relative_to("/"), path.read_text())
    release.write(folder / "release.json")
    _point(state_dir, "current", release.version)
    if before is not None and before.version != release.version:
        _point(state_dir, "previous", before.version)


def _prune(state_dir: Path, program: str, keep: set[str]) -> None:
    """Releases older than the one before: their image, models and records go."""
    for record in sorted((state_dir / RELEASES).glob("*/release.json")):
        old = Release.read(record)
        if old.version in keep:
            continue
        box.run(program, "rmi", "--force", old.image, check=False)
        shutil.rmtree(box.MODELS_DIR / old.version, ignore_errors=True)
        shutil.rmtree(record.parent, ignore_errors=True)


def _check_ids(bundle: Path) -> None:
    """systemd-sysusers quietly picks other ids when these are taken; the image's files belong to these."""
    text = (bundle / "systemd" / "appliance.sysusers.conf").read_text()
    uid = next(line.split()[2].split(":")[0] for line in text.splitlines() if line.startswith("u appliance"))
    gid = next(line.split()[2] for line in text.splitlines() if line.startswith("g appliance"))
    for database, number, what in (("passwd", uid, "uid"), ("group", gid, "gid")):
        name = _getent(database, number)
        if name and name[0] != "appliance":
            holder = f"group '{name[0]}'" if what == "gid" else f"'{name[0]}'"
            raise InstallError(
                f"{what} {number} is taken by {holder}; the image runs as {what} {number} "
                "(systemd/appliance.sysusers.conf): free it, or rebuild the image with other ids"
            )
    existing = _getent("passwd", "appliance")
    if existing and existing[2] != uid:
        raise InstallError(
            f"user 'appliance' exists with uid {existing[2]}, not {uid}; the container could not write its state: "
            "remove or renumber it"
        )


def _getent(database: str, key: str) -> list[str]:
    """The entry of the box's user database (NSS: files, LDAP, ...), split at ':'; [] when there is none."""
    found = box.run("getent", database, key, check=False)
    return found.stdout.strip().split(":") if found.returncode == 0 and found.stdout.strip() else []


@contextmanager
def _exclusive(options: Options, what: str):
    """One install, rollback or uninstall at a time: two would drain, stop and swap over each other."""
    if options.dry_run:
        yield
        return
    _need_root()
    options.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(options.state_dir / LOCK, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another one"
            raise InstallError(
                f"refused: appliance bundle {holder} is running ({options.state_dir / LOCK} is locked); "
                "let it finish, then run this again"
            ) from None
        handle.truncate(0)
        handle.write(f"{what} (pid {os.getpid()})")
        handle.flush()
        yield


def _check_not_older(release: Release, installed: Release, before: Release | None) -> None:
    """An old signed bundle replayed as an upgrade installs old code: only on purpose."""
    new, old = box.version_key(release.version), box.version_key(installed.version)
    if release.version == installed.version or (new is not None and old is not None and new > old):
        return
    back = f"'appliance bundle rollback' returns to {before.version}; " if before else ""
    how = "not comparable with" if new is None or old is None else "older than" if new < old else "another spelling of"
    raise InstallError(
        f"refused: {release.version} is {how} {installed.version}, the release in use; {back}to install it "
        "anyway, on purpose, give --downgrade"
    )


def _need_root() -> None:
    if os.geteuid() != 0:
        raise InstallError("run as root (it installs units, a system user and images)")


def _release_dir(state_dir: Path, version: str) -> Path:
    return state_dir / RELEASES / version


def _pointer(state_dir: Path, name: str) -> Release | None:
    path = state_dir / name
    try:
        version = path.read_bytes().decode("utf-8", errors="replace").strip()
    except FileNotFoundError:
        return None
    if not box.NAME.fullmatch(version):
        raise InstallError(
            f"{path} is damaged ({version[:40]!r} is not a version): write into it the version in use, one of "
            f"{' '.join(sorted(p.name for p in (state_dir / RELEASES).glob('*'))) or 'none recorded'}, "
            "or install its bundle again"
        )
    return Release.read(_release_dir(state_dir, version) / "release.json")


def _point(state_dir: Path, name: str, version: str) -> None:
    box.install_file(state_dir / name, version + "\n", mode=0o600)
