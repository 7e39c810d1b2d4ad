"""What the device has: total and used memory, from CUDA or from the CPU's memory limits, and whether it
multiplies bf16 natively.

This is the hardware boundary of the budget manager: tests substitute a
DeviceInfo (or pass `--device-memory`) instead of probing. It only reads; it never
allocates on the device, and the daemon can call it without importing torch on a CPU box.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_V2_LIMIT = Path("/sys/fs/cgroup/memory.max")
CGROUP_V1_LIMIT = Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")
MEMINFO = Path("/proc/meminfo")
SELF_STATUS = Path("/proc/self/status")
CPUINFO = Path("/proc/cpuinfo")
BF16_CPU_FLAGS = {"avx512_bf16", "amx_bf16"}
# cgroup v1 reports "no limit" as a huge number near 2**63.
_NO_LIMIT = 1 << 60


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cuda" | "cpu"
    total_bytes: int
    used_bytes: int = 0
    name: str = ""
    # bf16 matrix products in hardware (a GPU; a CPU with AVX512-BF16 or AMX): engine.rollout_dtype auto.
    bf16_matmul: bool = False

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "total_bytes": self.total_bytes,
            "used_bytes": self.used_bytes,
            "bf16_matmul": self.bf16_matmul,
        }


def cpu_bf16_matmul(cpuinfo: Path = CPUINFO) -> bool:
    """Whether this CPU computes bf16 dot products in hardware (AVX512-BF16 or AMX-BF16, the instructions torch's
    oneDNN kernels use). Without them torch emulates bf16 and a bf16 matmul is slower than fp32; with them it is
    faster (bench/README.md, "Figures behind constants in the code", "bf16 on the CPU"). Read from the kernel's
    CPU flags, so that the daemon need not import torch."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    for line in text.splitlines():
        # Every core lists the same flags; the first "flags" line answers for the machine.
        if line.startswith("flags"):
            return bool(BF16_CPU_FLAGS & set(line.partition(":")[2].split()))
    return False


def _kib_field(text: str, field: str) -> int | None:
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


def cgroup_limit_bytes(v2: Path = CGROUP_V2_LIMIT, v1: Path = CGROUP_V1_LIMIT) -> int | None:
    """The container's memory limit, or None when there is none."""
    for path in (v2, v1):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":  # cgroup v2's way of saying no limit
            return None
        limit = int(text)
        return None if limit >= _NO_LIMIT else limit
    return None


def cpu_total_bytes(meminfo: Path = MEMINFO, v2: Path = CGROUP_V2_LIMIT, v1: Path = CGROUP_V1_LIMIT) -> int:
    """The cgroup limit when one is set (and below the machine's RAM), else MemTotal."""
    mem_total = _kib_field(meminfo.read_text(), "MemTotal")
    if mem_total is None:
        raise RuntimeError(f"{meminfo} has no MemTotal line")
    limit = cgroup_limit_bytes(v2, v1)
    return min(limit, mem_total) if limit else mem_total


def process_rss_bytes(status: Path = SELF_STATUS) -> int:
    """Resident set size of this process now (VmRSS)."""
    return _kib_field(status.read_text(), "VmRSS") or 0


def probe_device(kind: str | None = None) -> DeviceInfo:
    """Probe the device the job will use: 'cuda', 'cpu', or None for CUDA when present else CPU."""
    if kind not in (None, "cuda", "cpu"):
        raise ValueError(f"device '{kind}' is not known; use cpu or cuda")
    if kind in (None, "cuda"):
        import torch

        if torch.cuda.is_available():
            # mem_get_info sees every process on the device, not only this one's allocations.
            free, total = torch.cuda.mem_get_info()
            # Read only for a CPU (engine.rollout_dtype auto); a GPU's copy follows the compute dtype.
            return DeviceInfo("cuda", int(total), int(total - free), torch.cuda.get_device_name(), bf16_matmul=True)
        if kind == "cuda":
            raise RuntimeError("no CUDA device is visible; plan with --device-memory SIZE or use --device cpu")
    return DeviceInfo("cpu", cpu_total_bytes(), process_rss_bytes(), os.uname().machine, cpu_bf16_matmul())


def reset_peak(kind: str) -> None:
    """Start a new peak measurement (before a phase): CUDA's allocator peak, or the process's VmHWM."""
    if kind == "cuda":
        import torch

        # Hand the previous phase's cached blocks back first. Otherwise the allocator keeps the train phase's
        # memory reserved through generation, so the device holds the sum of phases the plan time-shares and
        # the reserved peak reads the phase before (bench/README.md, "Figures behind constants in the code",
        # "Phase peaks on CUDA").
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    else:
        # Linux: writing 5 to clear_refs resets VmHWM to the current RSS.
        Path("/proc/self/clear_refs").write_text("5")


def peak_bytes(kind: str, status: Path = SELF_STATUS) -> int:
    """Peak memory since the last reset_peak: reserved by PyTorch on CUDA, or resident (VmHWM) on the CPU."""
    if kind == "cuda":
        import torch

        return int(torch.cuda.max_memory_reserved())
    return _kib_field(status.read_text(), "VmHWM") or 0
