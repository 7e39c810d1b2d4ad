"""Install v1, fill the queue, upgrade to v2, roll back: every job survives and finishes.

On a newcomer's box (tests/box_support.py: a bookworm root, chroot, the guide's commands), two real signed
bundles of this checkout's code, labelled 0.1.0 and 0.2.0, are verified and installed with the guide's
commands; the daemon is the real one, run directly from the code of the image its unit names (no container
can run here), as the appliance user, on the real bundled model. Jobs queued, running and paused by their
owner go through the upgrade (drained: the running one pauses at the end of its step; then image, models and
units are swapped and the drained jobs resume) and the rollback, and then all of them finish with every step
trained once. Uninstall removes units, shim and images and keeps the data. The drain's seconds are printed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from appliance.models.provision import DEMO_MODEL_NAME
from appliance.service.client import Client
from box_support import admin_box, make_bundle
from daemon_support import tiny_job, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.model]


def guide(box, command: str, timeout: float = 900) -> subprocess.CompletedProcess:
    done = box.run(command, timeout=timeout)
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}\n{log_of(box)}"
    return done


def log_of(box) -> str:
    path = box.path("/var/log/standin-appliance.log")
    return path.read_text(errors="replace")[-4000:] if path.exists() else ""


@pytest.fixture
def box(tmp_path: Path, signing_key, store_data_dir: Path):
    box = admin_box(tmp_path, signing_key.keyring)
    for version in ("0.1.0", "0.2.0"):
        make_bundle(
            version, box.path(f"/srv/bundle-{version}"), signing_key, tmp_path, (DEMO_MODEL_NAME, store_data_dir)
        )
    yield box
    box.kill_everything()


def install_command(version: str) -> str:
    bundle = f"/srv/bundle-{version}"
    return (
        f"/opt/appliance-client/bin/appliance bundle verify {bundle} && "
        f"{bundle}/install-bundle --runtime podman --device cpu"
    )


def submit(client: Client, folder: Path, name: str, steps: int) -> str:
    path = folder / f"{name}.yaml"
    path.write_text(tiny_job(name, steps=steps))
    return client.submit(path).job.id


def stepped(client: Client, job_id: str, box) -> bool:
    job = client.job(job_id)
    assert job.state not in ("failed", "interrupted"), f"{job.state}: {job.reason}\n{log_of(box)}"
    return job.step >= 1


def images(box) -> set[str]:
    state = json.loads(box.path("/var/lib/standin-podman/images.json").read_text())
    return {tag for image in state.values() for tag in image["tags"]}


def test_jobs_survive_an_upgrade_and_a_rollback_and_finish(box, tmp_path: Path):
    socket = box.path("/run/appliance/control.sock")
    installed = guide(box, install_command("0.1.0"))
    guide(box, "systemctl start appliance.service")
    client = Client(socket, timeout=60)
    wait_for(lambda: socket.exists() and client.status(), 120, "the 0.1.0 daemon")
    running = submit(client, tmp_path, "running", steps=4)
    queued = submit(client, tmp_path, "queued", steps=1)
    paused = submit(client, tmp_path, "paused", steps=1)
    client.pause(paused)
    wait_for(lambda: stepped(client, running, box), 600, "the first step of the running job")

    upgraded = guide(box, install_command("0.2.0"))
    after_upgrade = {job.id: job.state for job in client.jobs()}
    version_after_upgrade = client.status().version
    current_after_upgrade = os.readlink(box.path("/var/lib/appliance-models/current"))
    tags_after_upgrade = images(box)
    wait_for(lambda: client.job(running).state == "running", 300, "the running job to run again on 0.2.0")
    rolled_back = guide(box, "appliance bundle rollback")
    version_after_rollback = client.status().version
    client.resume(paused)
    for job_id in (running, queued, paused):
        wait_for(lambda job_id=job_id: client.job(job_id).state in ("succeeded", "failed"), 900, f"job {job_id}")
    jobs = {job_id: client.job(job_id) for job_id in (running, queued, paused)}
    steps = [
        json.loads(line)["step"]
        for line in box.path(f"/var/lib/appliance/jobs/{running}/metrics.jsonl").read_text().splitlines()
    ]
    drain = re.search(r"drained (\d+) job\(s\) in ([0-9.]+) s", upgraded.stdout)
    print(f"upgrade:\n{upgraded.stdout}rollback:\n{rolled_back.stdout}")
    client.close()
    uninstalled = guide(box, "appliance bundle uninstall")

    assert "installed 0.1.0" in installed.stdout
    assert drain and int(drain.group(1)) == 2, upgraded.stdout  # the running job and the queued one
    assert re.search(rf"pausing {running} \(running, running", rolled_back.stdout), rolled_back.stdout
    assert after_upgrade[paused] == "paused"  # its owner's pause stays
    assert after_upgrade[running] in ("queued", "running") and after_upgrade[queued] in ("queued", "running")
    assert (version_after_upgrade, current_after_upgrade) == ("0.2.0", "0.2.0")
    assert {"localhost/appliance:0.1.0", "localhost/appliance:0.2.0"} <= tags_after_upgrade
    assert version_after_rollback == "0.1.0" and "rollback 0.2.0 -> 0.1.0" in rolled_back.stdout
    assert {job_id: job.state for job_id, job in jobs.items()} == dict.fromkeys(jobs, "succeeded")
    assert {job_id: job.step for job_id, job in jobs.items()} == {running: 4, queued: 1, paused: 1}
    assert steps == [1, 2, 3, 4]  # every step trained once, across daemons of two versions
    old, new = (box.path(f"/var/lib/appliance-models/{v}/{DEMO_MODEL_NAME}/config.json") for v in ("0.1.0", "0.2.0"))
    assert old.stat().st_ino == new.stat().st_ino  # the same model in both releases: one copy on disk
    assert "uninstalled" in uninstalled.stdout and "kept /var/lib/appliance" in uninstalled.stdout
    assert images(box) == set()
    assert not box.path("/etc/containers/systemd/appliance.container").exists()
    assert not box.path("/usr/local/bin/appliance").exists()
    assert box.path("/var/lib/appliance/appliance.db").is_file()
