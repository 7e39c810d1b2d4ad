"""One launcher for a job's ranks (appliance/ranks.py): `appliance train` and the daemon's worker both start ranks
through ranks.launch_ranks, and nothing of ours writes the variables torch's launcher gives each rank."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAUNCHERS_VARIABLES = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
}


def _writes(tree: ast.AST) -> list[int]:
    """Lines that write one of the launcher's variables: env["RANK"] = ..., env.update(RANK=...), {"RANK": ...},
    env.setdefault("RANK", ...), os.putenv("RANK", ...)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and _named(target.slice):
                    lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("update", "setdefault", "putenv") and (
                any(keyword.arg in LAUNCHERS_VARIABLES for keyword in node.keywords)
                or (node.func.attr != "update" and node.args and _named(node.args[0]))
            ):
                lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(key is not None and _named(key) for key in node.keys):
            lines.append(node.lineno)
    return lines


def _named(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in LAUNCHERS_VARIABLES


def test_nothing_of_ours_writes_a_ranks_launcher_variables():
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sorted((REPO / "appliance").rglob("*.py"))
        for line in _writes(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not found, "only torch's launcher (ranks.launch_ranks) sets these: " + ", ".join(found)


def test_the_write_check_sees_each_way_of_writing(tmp_path):
    sample = 'env["RANK"] = "0"\nenv.update(WORLD_SIZE="2")\nx = {"MASTER_PORT": 1}\nos.putenv("LOCAL_RANK", "1")\n'
    assert _writes(ast.parse(sample)) == [1, 2, 3, 4]
    assert _writes(ast.parse('int(os.environ.get("RANK", "0"))\n')) == []  # reading is every rank's business


def test_the_cli_and_the_daemon_start_ranks_through_the_same_function():
    for module in ("appliance/cli/train_cmd.py", "appliance/service/worker.py"):
        tree = ast.parse((REPO / module).read_text(encoding="utf-8"))
        calls = {
            node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }
        assert "launch_ranks" in calls, f"{module} does not start its ranks through ranks.launch_ranks"


def _rank(fail_rank: int) -> None:
    import os

    if int(os.environ["RANK"]) == fail_rank:
        raise SystemExit(3)


KILLED_LAUNCHER = """
import sys, time
from pathlib import Path
from appliance.ranks import Topology, launch_ranks
def rank():
    print("running", flush=True)
    time.sleep(600)
launch_ranks("killed", Topology(1, None, None, 2), rank, (), Path(sys.argv[1]))
"""


def test_a_launch_leaves_no_folder_behind_in_tmp_or_beside_the_job(tmp_path, monkeypatch):
    """torch's launcher kept each launch's rank logs in a /tmp folder (torchelastic_*) it never removed: the daemon
    left one per job start and restart (104 on a test box after a day). Its folder is now the job's: gone when the
    ranks end, well or not, and a launcher killed with SIGKILL (the daemon's cancel) leaves only that one, which the
    next launch of the job replaces."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    import pytest

    from appliance.ranks import LaunchError, Topology, launch_logs, launch_ranks

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    logs = launch_logs(tmp_path / "jobs" / "j")
    launch_ranks("ends-well", Topology(1, None, None, 2), _rank, (-1,), logs)
    with pytest.raises(LaunchError, match="rank 1 \\(exit code 3\\)"):
        launch_ranks("fails", Topology(1, None, None, 2), _rank, (1,), logs)
    assert not logs.exists()
    # torch's compiler keeps a cache there (torchinductor_<user>) that outlives any one launch, by design; a failed
    # rank's torch.multiprocessing error pickle (a file) is torch's too.
    left = [path.name for path in temporary.iterdir() if path.is_dir() and not path.name.startswith("torchinductor_")]
    assert left == []

    killed = subprocess.Popen([sys.executable, "-c", KILLED_LAUNCHER, str(logs)], stdout=subprocess.PIPE,
                              env={**os.environ, "TMPDIR": str(temporary)}, start_new_session=True)  # fmt: skip
    try:
        assert killed.stdout.readline() == b"running\n"
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=30)
    time.sleep(0.2)
    assert logs.is_dir() and not [path for path in temporary.iterdir() if path.name.startswith("torchelastic_")]
    launch_ranks("again", Topology(1, None, None, 2), _rank, (-1,), logs)
    assert not logs.exists()


def test_a_rendezvous_port_already_taken_is_one_sentence_not_a_traceback(tmp_path):
    """Node 0 of a several-box job binds the --rdzv-endpoint port; one in use raised torch's DistNetworkError
    through `appliance train` as a traceback."""
    import socket

    import pytest

    from appliance.ranks import LaunchError, Topology, launch_logs, launch_ranks

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        endpoint = f"127.0.0.1:{taken.getsockname()[1]}"
        logs = launch_logs(tmp_path / "jobs" / "j")
        with pytest.raises(LaunchError, match=f"rendezvous of 'j' at {endpoint} failed .*address already in use"):
            launch_ranks("j", Topology(2, 0, endpoint, 1), _rank, (-1,), logs)
    assert not logs.exists()
