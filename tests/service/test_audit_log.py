"""The audit log rotates by size and sums what a caller repeats (refusals, dry runs) into one line per window."""

from __future__ import annotations

import ipaddress
import json
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.http_listener import network_of
from appliance.service import audit
from appliance.service.audit import AuditLog
from disk_support import fill_disk


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_log_rotates_by_size_and_keeps_its_backups(tmp_path):
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=2000, backups=2)
    for number in range(100):
        log.record(uid=0, pid=1, action="cancel", job_id=None, outcome=f"ok {number}")
    log.close()
    files = sorted(path.name for path in tmp_path.iterdir())
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    assert all(path.stat().st_size <= 2000 for path in tmp_path.iterdir())
    assert lines(tmp_path / "audit.jsonl")[-1]["outcome"] == "ok 99"
    assert (tmp_path / "audit.jsonl").stat().st_mode & 0o777 == 0o640


def test_a_flood_of_unauthenticated_requests_is_summarised(tmp_path, monkeypatch):
    log = AuditLog(tmp_path / "audit.jsonl")
    for _ in range(1000):
        log.refused_tcp("10.0.0.9:4444", "refused: wrong bearer token (GET /" + "a" * 5000 + ")")
    assert len(lines(tmp_path / "audit.jsonl")) == audit.WRITTEN_PER_WINDOW
    assert all(len(line["outcome"]) <= audit.MAX_FIELD for line in lines(tmp_path / "audit.jsonl"))
    monkeypatch.setattr(audit, "WINDOW_SECONDS", 0.0)  # the window ends now
    time.sleep(0.01)
    log.refused_tcp("10.0.0.9:4444", "refused: no bearer token")
    log.close()
    found = lines(tmp_path / "audit.jsonl")
    summary = found[audit.WRITTEN_PER_WINDOW]
    assert summary["action"] == "summary" and summary["remote"] == "10.0.0.9"
    assert f"{1000 - audit.WRITTEN_PER_WINDOW} authenticate refused" in summary["outcome"]
    assert found[-1]["outcome"] == "refused: no bearer token"
    assert (tmp_path / "audit.jsonl").stat().st_size < 10_000


loopback_addresses = st.integers(0, 2**24 - 1).map(lambda n: str(ipaddress.IPv4Address((127 << 24) + n)))
one_64 = st.integers(0, 2**64 - 1).map(lambda n: str(ipaddress.IPv6Address((0x20010DB8_00000001 << 64) + n)))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(loopback_addresses, one_64), min_size=1, max_size=60), st.integers(1, 65535))
def test_a_host_sending_from_many_addresses_is_one_caller(addresses, port):
    """Any local account may send from all of 127.0.0.0/8, an IPv6 host from all of its /64: one caller each."""
    networks = {network_of(f"[{a}]:{port}" if ":" in a else f"{a}:{port}") for a in addresses}
    assert networks <= {"loopback", "2001:db8:0:1::/64"}


def test_a_flood_from_every_loopback_address_cannot_rotate_the_history(tmp_path):
    """An outside account's unauthenticated requests to the TCP control port, each from another loopback address:
    per address it had 20 lines a minute, so 4096 addresses wrote 80k lines a minute (96 MiB in minutes)."""
    log = AuditLog(tmp_path / "audit.jsonl")
    for number in range(5000):
        log.refused_tcp(f"127.{number // 62500 % 250}.{number // 250 % 250}.{2 + number % 250}:4000", "refused: x")
    for number in range(500):
        log.refused_tcp(f"[2001:db8:0:1::{number:x}]:4000", "refused: x")
    log.close()
    found = lines(tmp_path / "audit.jsonl")
    assert len([line for line in found if line["action"] == "authenticate"]) == 2 * audit.WRITTEN_PER_WINDOW
    assert {line["remote"] for line in found if line["action"] == "summary"} == {"loopback", "2001:db8:0:1::/64"}


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hosts=st.integers(300, 1500), per_host=st.integers(1, 8))
def test_a_flood_from_many_hosts_grows_the_log_by_a_bounded_rate(tmp_path_factory, hosts, per_host):
    """Every IPv4 address, or every /64 of a routed /48, is a caller of its own: 4096 of them wrote 20 lines and
    a summary each per window (25 MB a minute: the whole history gone in minutes)."""
    folder = tmp_path_factory.mktemp("audit")
    log = AuditLog(folder / "audit.jsonl")
    log.record(uid=0, pid=1, action="cancel", job_id="00000000aa", outcome="ok")
    for number in range(hosts * per_host):
        host = number % hosts
        log.refused_tcp(f"[2001:db8:{host >> 16:x}:{host & 0xFFFF:x}::1]:4000", "refused: no bearer token")
    log.close()  # every window ends: the summaries are written
    found = lines(folder / "audit.jsonl")
    assert found[0]["job_id"] == "00000000aa"
    written = [line for line in found if line["action"] == "authenticate"]
    summaries = [line for line in found if line["action"] == "summary"]
    assert len(written) <= audit.WRITTEN_ALL_PER_WINDOW and len(summaries) <= audit.SUMMARIES_PER_WINDOW + 1
    counted = sum(int(line["outcome"].split()[0]) for line in summaries)
    assert len(written) + counted == hosts * per_host  # nothing unaccounted for


def test_one_callers_flood_neither_rotates_the_history_nor_silences_another_caller(tmp_path):
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=64 * 1024)
    log.record(uid=1000, pid=5, action="submit", job_id="00000000aa", outcome="ok")
    for number in range(20_000):  # a 404 loop: what rotated the whole history out before
        log.chatter(("uid", 1001), uid=1001, pid=6, action="request", job_id=None, outcome=f"refused: 404 ({number})")
    log.chatter(("uid", 1002), uid=1002, pid=7, action="dry_run", job_id=None, outcome="refused: bad file")
    log.record(uid=1001, pid=6, action="cancel", job_id="00000000bb", outcome="ok")  # real actions are all written
    log.close()
    found = lines(tmp_path / "audit.jsonl")
    assert not (tmp_path / "audit.jsonl.1").exists(), "a flood rotated the log"
    assert found[0]["job_id"] == "00000000aa"
    assert [line["uid"] for line in found if line["action"] == "request"] == [1001] * audit.WRITTEN_PER_WINDOW
    assert any(line["uid"] == 1002 and line["action"] == "dry_run" for line in found)
    assert any(line["job_id"] == "00000000bb" for line in found)
    summary = next(line for line in found if line["action"] == "summary")
    assert summary["uid"] == 1001 and f"{20_000 - audit.WRITTEN_PER_WINDOW} request refused" in summary["outcome"]


def test_a_line_the_full_disk_refuses_goes_to_the_daemon_log_and_the_log_writes_again_after(small_disk, capfd):
    log = AuditLog(small_disk / "audit.jsonl", max_bytes=64 * 1024)
    filler = fill_disk(small_disk)
    for number in range(400):  # past the page the file already holds, and through a rotation
        log.record(uid=0, pid=1, action="cancel", job_id=None, outcome=f"ok {number} " + "x" * 200)
    assert "audit.jsonl refused a line ([Errno 28] No space left on device)" in capfd.readouterr().err
    filler.unlink()
    log.record(uid=0, pid=1, action="cancel", job_id=None, outcome="after")
    log.close()
    assert lines(small_disk / "audit.jsonl")[-1]["outcome"] == "after"
