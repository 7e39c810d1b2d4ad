"""Orphans re-parented to the daemon are reaped, and its own children's exit status is never taken from them.

Each check runs in a fresh Python process that becomes a child subreaper as the daemon does, so the test
run itself is left as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from appliance.service.reaper import reap_orphans

CANCELS = textwrap.dedent(
    """
    import json, os, socket, subprocess, sys, threading, time
    from pathlib import Path
    from appliance.metrics.training_metrics import TrainingMetrics
    from appliance.service.reaper import become_subreaper
    from appliance.service.job_store import JobStore
    from appliance.service.supervisor import Slot, Supervisor, Worker
    from appliance.service.worker import Channel

    def zombies():
        found = []
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if entry.name.isdigit() and fields[0] == "Z" and int(fields[1]) == os.getpid():
                found.append(int(entry.name))
        return found

    assert become_subreaper()
    data = Path(sys.argv[1])
    store = JobStore(data / "appliance.db")
    metrics = TrainingMetrics(version="t", student_model="", judge_model=None)
    supervisor = Supervisor(store, data, [Slot(0, "cpu", "cpu")], metrics)
    before = []
    for n in range(20):
        job = store.submit("t", 0, "u", {"name": "t"}, None, 1)
        store.transition(job.id, "running", "started", slot=0)
        ours, theirs = socket.socketpair()
        # a worker with a grandchild, as vLLM's EngineCore or a reward plugin's helper is
        proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"], process_group=0)
        time.sleep(0.05)
        worker = Worker(job.id, supervisor.slots[0], proc, Channel(ours), time.time())
        supervisor.workers[0] = worker
        supervisor.cancel(job.id)
        before.append(store.get(job.id).summary.state)
        time.sleep(0.05)
        supervisor.tick()
    time.sleep(0.2)
    supervisor.tick()
    print(json.dumps({"states": sorted(set(before)), "zombies": zombies(), "workers": len(supervisor.workers)}))
    """
)


def test_twenty_cancels_of_workers_with_grandchildren_leave_no_zombie(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run(
        [sys.executable, "-c", CANCELS, str(tmp_path)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"states": ["cancelled"], "zombies": [], "workers": 0}


def test_the_reaper_leaves_a_known_child_and_a_same_group_child_to_their_owner():
    known = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"], process_group=0)
    ours = subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"])  # as subprocess.run in another thread
    os.waitid(os.P_PID, known.pid, os.WEXITED | os.WNOWAIT)
    os.waitid(os.P_PID, ours.pid, os.WEXITED | os.WNOWAIT)
    reap_orphans({known.pid})  # may reap real orphans of earlier tests; never these two
    assert known.wait() == 7 and ours.wait() == 5
