"""What the daemon reads of a job's folder is read with a byte cap, whatever size the file claims: a failed job's
reason quotes the end of its log (it read the whole log.txt, of any size, into the daemon), a job's page reads
best/best.json (it read it whole; a FIFO there would hold a thread for ever)."""

from __future__ import annotations

import os
import time
import tracemalloc

from appliance.service.bounded_reads import LOG_END_BYTES, json_file, log_end


def test_the_end_of_a_huge_sparse_log_is_read_in_bounded_memory(tmp_path):
    log = tmp_path / "log.txt"
    with open(log, "wb") as handle:
        handle.truncate(8 << 30)  # 8 GiB that take no disk
        handle.seek(0, os.SEEK_END)
        handle.write(b"Traceback (most recent call last):\nValueError: the end\n")
    tracemalloc.start()
    started = time.monotonic()
    text = log_end(log)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert text.endswith("ValueError: the end\n")
    assert peak < 4 * LOG_END_BYTES and time.monotonic() - started < 1.0


def test_a_json_file_over_its_cap_or_not_a_file_is_none_at_once(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as handle:
        handle.truncate(4 << 30)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # no writer: a plain open would wait for one for ever
    good = tmp_path / "best.json"
    good.write_text('{"step": 3}')
    started = time.monotonic()
    assert json_file(big) is None and json_file(fifo) is None and json_file(tmp_path / "absent.json") is None
    assert json_file(good) == {"step": 3}
    assert time.monotonic() - started < 1.0
