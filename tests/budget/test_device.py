"""Device probing: cgroup limits, MemTotal, RSS; CUDA is absent on the CI machine."""

from __future__ import annotations

import mmap
import pytest

from appliance.budget.device_probe import (
    cgroup_limit_bytes,
    cpu_bf16_matmul,
    cpu_total_bytes,
    peak_bytes,
    probe_device,
    process_rss_bytes,
    reset_peak,
)

MEMINFO = "MemTotal:       24683520 kB\nMemFree:        16000000 kB\n"


def files(tmp_path, v2=None, v1=None):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    v2_path, v1_path = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    if v2 is not None:
        v2_path.write_text(v2 + "\n")
    if v1 is not None:
        v1_path.write_text(v1 + "\n")
    return meminfo, v2_path, v1_path


def test_without_a_cgroup_limit_the_cpu_has_memtotal(tmp_path):
    meminfo, v2, v1 = files(tmp_path, v2="max")
    assert cgroup_limit_bytes(v2, v1) is None
    assert cpu_total_bytes(meminfo, v2, v1) == 24683520 * 1024


def test_a_cgroup_v2_limit_is_the_cpu_total(tmp_path):
    meminfo, v2, v1 = files(tmp_path, v2=str(8 * 2**30))
    assert cpu_total_bytes(meminfo, v2, v1) == 8 * 2**30


def test_cgroup_v1_unlimited_sentinel_means_no_limit(tmp_path):
    meminfo, v2, v1 = files(tmp_path, v1="9223372036854771712")
    assert cgroup_limit_bytes(v2, v1) is None
    assert cpu_total_bytes(meminfo, v2, v1) == 24683520 * 1024


def test_a_limit_above_the_machine_ram_is_capped_at_memtotal(tmp_path):
    meminfo, v2, v1 = files(tmp_path, v2=str(64 * 2**30))
    assert cpu_total_bytes(meminfo, v2, v1) == 24683520 * 1024


def test_process_rss_grows_when_this_process_touches_memory():
    # A fresh anonymous mapping: heap memory freed by earlier tests could be reused without new pages.
    block = mmap.mmap(-1, 64 * 2**20)
    before = process_rss_bytes()
    for index in range(0, len(block), 4096):
        block[index] = 1
    grown = process_rss_bytes() - before
    block.close()
    assert grown >= 60 * 2**20


def test_probe_cpu_reports_the_machine():
    device = probe_device("cpu")
    assert device.kind == "cpu"
    assert device.total_bytes >= 2**30
    assert 0 < device.used_bytes < device.total_bytes


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("fpu avx2 avx512f avx512_bf16 avx512_vnni", True),
        ("fpu avx2 amx_tile amx_bf16", True),
        ("fpu avx2 avx512f", False),
    ],
)
def test_bf16_matmul_is_read_from_the_cpu_flags(tmp_path, flags, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    assert cpu_bf16_matmul(cpuinfo) is expected
    assert cpu_bf16_matmul(tmp_path / "absent") is False


def test_the_cpu_probe_agrees_with_torch_and_does_not_import_it():
    import subprocess
    import sys

    code = "import sys; from appliance.budget.device_probe import probe_device; d = probe_device('cpu'); "
    code += "print(d.bf16_matmul, 'torch' in sys.modules)"
    probed, imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split()
    import torch

    assert imported == "False"  # the daemon plans without loading torch
    assert probed == str(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def test_probe_cuda_without_a_gpu_says_how_to_plan_instead():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="--device-memory"):
        probe_device("cuda")
    assert probe_device().kind == "cpu"


def test_unknown_device_kind_is_refused():
    with pytest.raises(ValueError, match="use cpu or cuda"):
        probe_device("tpu")


def test_cpu_peak_covers_a_freed_block_and_resets_for_the_next_phase():
    import mmap

    reset_peak("cpu")
    # Fresh pages from the kernel, given back on close: a malloc'd block may reuse pages the process already
    # holds (seen in the full suite after the model tests: RSS 3.9 GB, the block moved neither RSS nor VmHWM).
    block = mmap.mmap(-1, 256 * 2**20)
    for index in range(0, len(block), 4096):
        block[index] = 1
    with_block = peak_bytes("cpu")
    block.close()
    assert with_block - process_rss_bytes() >= 200 * 2**20
    reset_peak("cpu")
    assert peak_bytes("cpu") < with_block - 200 * 2**20


def test_a_cuda_phase_returns_the_cached_blocks_before_its_peak_is_reset(monkeypatch):
    """Hardware boundary: torch.cuda's allocator calls, recorded in order."""
    import torch

    from appliance.budget.device_probe import peak_bytes, reset_peak

    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: calls.append("reset_peak_memory_stats"))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 123 << 20)
    reset_peak("cuda")
    assert calls == ["empty_cache", "reset_peak_memory_stats"]
    assert peak_bytes("cuda") == 123 << 20
