"""Host memory a merged export needs, checked before it loads anything.

A merged export holds the base in fp32 (the merge loses nothing) and writes it cast to the asked dtype:
four bytes a parameter, and two more for a bf16 copy. The daemon runs exports on the box that trains, so an
export that cannot fit is refused up front, naming both figures, instead of being OOM-killed halfway.
"""

from __future__ import annotations

import math
from pathlib import Path

from safetensors import safe_open

from appliance.errors import ExportError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Python, torch and peft themselves, and the adapter's own tensors.
RUNTIME_BYTES = 1 << 30


def parameter_count(model_dir: Path) -> int:
    """Elements in the model folder's safetensors files, read from their headers alone."""
    count = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                count += math.prod(handle.get_slice(name).get_shape())
    return count


def merged_export_bytes(model_dir: Path, dtype: str) -> int:
    """The peak host memory of a merged export: the fp32 base, its copy in `dtype`, and the runtime."""
    return parameter_count(model_dir) * (4 + DTYPE_BYTES[dtype]) + RUNTIME_BYTES


def available_host_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            # MemAvailable, not MemFree: page cache the kernel would hand back counts as available. In KiB.
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_merged_export_fits(model_dir: Path, dtype: str, available: int | None) -> None:
    """Refuse, with both figures, a merged export that would need more host memory than is available."""
    needed = merged_export_bytes(model_dir, dtype)
    if available is not None and needed > available:
        raise ExportError(
            f"a merged export of {Path(model_dir).name} needs about {needed / 2**30:.1f} GiB of host memory "
            f"(the fp32 base and its {dtype} copy) and {available / 2**30:.1f} GiB is available; export the "
            "adapter alone (no --merged), or merge on a machine with more memory"
        )
