"""An upgrade that goes wrong on a newcomer's box (tests/box_support.py): the release in use must keep running.

A release whose daemon does not start (here: a job store migration that fails, as a bug or a full disk would
make it) is taken back by the install itself: the service runs the release before again, from its own units,
image and models, on the job store as it was, and the records still name it. Two installs, rollbacks or
uninstalls never run at once. The daemon is the real one, run directly by the stand-in systemctl.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from appliance.service.client import Client
from box_support import REPO_ROOT, admin_box, copy_tree, make_bundle
from daemon_support import wait_for

# A newcomer's box per test (tens of seconds each): run with the slow tier, beside nothing lighter.
pytestmark = pytest.mark.slow

MIGRATIONS = "opt/appliance/src/appliance/service/store_migrations.py"


def broken_migration() -> bytes:
    """The checkout's migrations and one more, to a schema 3, whose statement fails (no such table)."""
    text = (REPO_ROOT / "appliance" / "service" / "store_migrations.py").read_text()
    start = text.index("SCHEMA_VERSION = ")
    end = text.index("\n", start)
    current = int(text[start:end].split("=")[1].split("#")[0])
    step = (
        f"MIGRATIONS = MIGRATIONS + (Migration({current + 1}, "
        '("ALTER TABLE no_such_table ADD COLUMN broken TEXT",), readable_by=1, what="fails"),)\n'
    )
    text = text[:start] + step + f"SCHEMA_VERSION = {current + 1}" + text[end:]
    return text.encode()


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, signing_key) -> Path:
    """0.1.0 as it is, and a 0.2.0 whose daemon cannot start: made once, copied into each box."""
    work = tmp_path_factory.mktemp("bundles")
    make_bundle("0.1.0", work / "bundle-0.1.0", signing_key, work)
    make_bundle("0.2.0", work / "bundle-0.2.0", signing_key, work, changes={MIGRATIONS: broken_migration()})
    return work


@pytest.fixture
def box(tmp_path: Path, signing_key, bundles: Path):
    box = admin_box(tmp_path, signing_key.keyring)
    for version in ("0.1.0", "0.2.0"):
        copy_tree(bundles / f"bundle-{version}", box.path(f"/srv/bundle-{version}"))
    yield box
    box.kill_everything()


def run(box, command: str):
    return box.run(command, timeout=600)


def install(version: str) -> str:
    return f"appliance bundle verify /srv/bundle-{version} && /srv/bundle-{version}/install-bundle --device cpu"


def schema(box) -> str:
    db = sqlite3.connect(f"file:{box.path('/var/lib/appliance/appliance.db')}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT key, value FROM meta").fetchall())["schema_version"]
    finally:
        db.close()


def log(box) -> str:
    path = box.path("/var/log/standin-appliance.log")
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def test_an_upgrade_whose_daemon_does_not_start_returns_to_the_release_before(box):
    assert run(box, "/opt/appliance-client/bin/" + install("0.1.0")).returncode == 0
    assert run(box, "systemctl start appliance.service").returncode == 0
    socket = box.path("/run/appliance/control.sock")
    client = Client(socket, timeout=60)
    wait_for(lambda: client.status(), 60, "the 0.1.0 daemon")
    before = schema(box)

    failed = run(box, "/opt/appliance-client/bin/" + install("0.2.0"))
    status = run(box, "appliance bundle status")

    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "appliance 0.2.0 did not start" in failed.stderr and "0.1.0 runs again" in failed.stderr, failed.stderr
    assert "returning to 0.1.0" in failed.stdout and "appliance 0.1.0 is running" in failed.stdout, log(box)
    assert Client(socket, timeout=60).status().version == "0.1.0"
    assert status.stdout.startswith("in use: 0.1.0 ")
    assert os.readlink(box.path("/var/lib/appliance-models/current")) == "0.1.0"
    unit = box.path("/etc/containers/systemd/appliance.container").read_text()
    assert "Image=localhost/appliance:0.1.0" in unit
    assert schema(box) == before  # the failed migration changed nothing


def test_two_installs_rollbacks_or_uninstalls_never_run_at_once(box):
    """Another one holding the install lock (here this test, from outside the box): each command is refused in
    one sentence before it changes anything; once the lock is free, the same install goes through."""
    assert run(box, "/opt/appliance-client/bin/" + install("0.1.0")).returncode == 0
    lock = box.path("/var/lib/appliance-install/lock")
    with open(lock, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.truncate(0)
        held.write("install (pid 4242)")
        held.flush()
        refused = {
            command: run(box, command)
            for command in (
                "/opt/appliance-client/bin/" + install("0.1.0"),
                "appliance bundle rollback",
                "appliance bundle uninstall --purge",
            )
        }

    for command, result in refused.items():
        assert result.returncode == 1, f"{command}\n{result.stdout}\n{result.stderr}"
        assert "refused: appliance bundle install (pid 4242) is running" in result.stderr, result.stderr
    assert box.path("/usr/local/bin/appliance").exists() and box.path("/var/lib/appliance-install/current").exists()
    again = run(box, "/opt/appliance-client/bin/" + install("0.1.0"))
    assert again.returncode == 0 and "upgrade 0.1.0 -> 0.1.0" in again.stdout, again.stderr


def test_an_upgrade_that_fills_the_disk_while_writing_its_files_returns_to_the_release_before(box):
    """ENOSPC after the drain and the stop (the new release's documentation, wheels and SBOMs go to a 16 KiB
    tmpfs mounted over /usr/share/doc): the install puts 0.1.0 back and starts it, and says so in one sentence."""
    assert run(box, "/opt/appliance-client/bin/" + install("0.1.0")).returncode == 0
    assert run(box, "systemctl start appliance.service").returncode == 0
    socket = box.path("/run/appliance/control.sock")
    wait_for(lambda: Client(socket, timeout=60).status(), 60, "the 0.1.0 daemon")
    docs = box.path("/usr/share/doc")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(docs)], check=True)
    try:
        failed = run(box, "/opt/appliance-client/bin/" + install("0.2.0"))
    finally:
        subprocess.run(["umount", "--lazy", str(docs)], check=True)

    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "Traceback" not in failed.stderr and len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert "No space left on device" in failed.stderr and "0.1.0 runs again" in failed.stderr, failed.stderr
    assert Client(socket, timeout=60).status().version == "0.1.0", log(box)
    assert run(box, "appliance bundle status").stdout.startswith("in use: 0.1.0 ")
    assert os.readlink(box.path("/var/lib/appliance-models/current")) == "0.1.0"
    assert "Image=localhost/appliance:0.1.0" in box.path("/etc/containers/systemd/appliance.container").read_text()


def running_with_systemctl(box, before: str) -> Path:
    """0.1.0 installed and its daemon answering, then a systemctl stand-in that runs `before` (shell) ahead of the
    real one: the fault the test injects. The control socket's path."""
    assert run(box, "/opt/appliance-client/bin/" + install("0.1.0")).returncode == 0
    assert run(box, "systemctl start appliance.service").returncode == 0
    socket = box.path("/run/appliance/control.sock")
    wait_for(lambda: Client(socket, timeout=60).status(), 60, "the 0.1.0 daemon")
    standin = box.path("/usr/local/sbin/systemctl")
    standin.rename(standin.with_name("systemctl.real"))
    standin.write_text(f'#!/bin/sh\n{before}exec /usr/local/sbin/systemctl.real "$@"\n')
    standin.chmod(0o755)
    return socket


def test_a_rollback_after_an_upgrade_killed_half_way_returns_to_the_release_in_use(box):
    """kill -9 of the installer at the swap (at its daemon-reload: models and units are the new release's, the
    service stopped, the records still name 0.1.0): status says so, and rollback puts 0.1.0 back and runs it,
    where it said 'nothing to roll back to' (no release before 0.1.0 is recorded)."""
    socket = running_with_systemctl(
        box,
        'if [ "$1" = daemon-reload ] && rm /root/kill-at-reload 2>/dev/null; then kill -9 "$PPID"; fi\n',
    )
    box.path("/root/kill-at-reload").write_text("")

    killed = run(box, "/opt/appliance-client/bin/" + install("0.2.0"))
    assert killed.returncode != 0 and not box.path("/root/kill-at-reload").exists(), killed.stdout + killed.stderr
    assert os.readlink(box.path("/var/lib/appliance-models/current")) == "0.2.0"  # half-way indeed
    halfway = run(box, "appliance bundle status").stdout
    back = run(box, "appliance bundle rollback")
    status = run(box, "appliance bundle status").stdout

    assert "the swap to 0.2.0 did not finish" in halfway and "rollback returns to: 0.1.0" in halfway, halfway
    assert back.returncode == 0, back.stdout + back.stderr
    assert Client(socket, timeout=60).status().version == "0.1.0", log(box)
    assert status.startswith("in use: 0.1.0 ") and "did not finish" not in status, status
    assert os.readlink(box.path("/var/lib/appliance-models/current")) == "0.1.0"
    assert "Image=localhost/appliance:0.1.0" in box.path("/etc/containers/systemd/appliance.container").read_text()


def test_an_uninstall_whose_stop_fails_removes_nothing(box):
    """`uninstall --purge` while the service will not stop (a stop that times out, here a systemctl whose stop
    fails): it refuses before removing units, images or data, where it pulled them from under the daemon."""
    socket = running_with_systemctl(box, 'case "$1" in stop|disable) exit 1 ;; esac\n')

    refused = run(box, "appliance bundle uninstall --purge")

    assert refused.returncode == 1 and "did not stop, so nothing was removed" in refused.stderr, refused.stderr
    assert Client(socket, timeout=60).status().version == "0.1.0"
    assert box.path("/var/lib/appliance/appliance.db").exists() and box.path("/usr/local/bin/appliance").exists()
    assert box.path("/etc/containers/systemd/appliance.container").exists()
    assert run(box, "appliance bundle status").stdout.startswith("in use: 0.1.0 ")


def test_an_upgrade_over_a_daemon_that_does_not_answer_still_swaps(box):
    """The service is active but its daemon does not answer (here its socket is gone): the drain cannot ask it
    anything, so the upgrade says so and stops the service (whose stop chain checkpoints running jobs) instead
    of ending with "start it with 'appliance serve'" and leaving a box nobody can upgrade or roll back. The 0.2.0
    of these tests does not start, so the end is 0.1.0 running again."""
    assert run(box, "/opt/appliance-client/bin/" + install("0.1.0")).returncode == 0
    assert run(box, "systemctl start appliance.service").returncode == 0
    socket = box.path("/run/appliance/control.sock")
    wait_for(lambda: Client(socket, timeout=60).status(), 60, "the 0.1.0 daemon")
    socket.unlink()

    upgrade = run(box, "/opt/appliance-client/bin/" + install("0.2.0"))

    assert "no drain: the daemon does not answer" in upgrade.stdout, upgrade.stdout + upgrade.stderr
    assert "returning to 0.1.0" in upgrade.stdout and "0.1.0 runs again" in upgrade.stderr, upgrade.stderr
    assert Client(socket, timeout=60).status().version == "0.1.0", log(box)
    assert "did not finish" not in run(box, "appliance bundle status").stdout
