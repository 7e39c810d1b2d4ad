"""A rank's process ends with its own exit code, its output flushed and its process group destroyed, without the
interpreter's finalization (where gloo's threads aborted a finished rank: grpo/distributed.end_rank_process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

RANK = textwrap.dedent(
    """
    import atexit, os, sys
    import torch, torch.distributed as dist
    from appliance.grpo.distributed import end_rank_process

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(4))  # gloo's worker threads have run a collective
    atexit.register(lambda: print("finalized", flush=True))
    sys.stdout.write("last line, buffered")  # no newline, no flush: end_rank_process flushes it
    end_rank_process(7)
    print("never reached")
    """
)


def _free_port() -> str:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def test_a_rank_ends_with_its_code_and_output_and_skips_finalization():
    ended = subprocess.run(
        [sys.executable, "-c", RANK, _free_port()],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert ended.returncode == 7, ended.stderr[-2000:]
    assert ended.stdout == "last line, buffered"  # flushed; neither the atexit handler nor the line after ran
    assert "terminate called" not in ended.stderr
