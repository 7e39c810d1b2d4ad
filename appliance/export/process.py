"""One export in its own process, so that a merged export's model (tens of GB) never lives in the daemon.

    python -m appliance.export.process JOB_DIR DATA_DIR OUT CHECKPOINT MERGED DTYPE

Prints one JSON line: {"ok": true, "path", "kind", "job", "step", "manifest"} or {"ok": false, "error"}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MODULE = "appliance.export.process"


def staging_prefix(out: Path) -> str:
    """The name prefix of an export's staging folders beside `out` (a killed export leaves them; the daemon removes them)."""
    return f".{out.name}.export-"


def main(argv: list[str] | None = None) -> int:
    from appliance.errors import ApplianceError
    from appliance.export.exporter import export_job

    job_dir, data_dir, out, checkpoint, merged, dtype = argv if argv is not None else sys.argv[1:]
    try:
        result = export_job(Path(job_dir), Path(data_dir), Path(out), checkpoint, merged == "merged", dtype)
    except ApplianceError as error:
        print(json.dumps({"ok": False, "error": str(error)}), flush=True)
        return 2
    answer = {"ok": True, "path": str(result.path), "kind": result.kind, "job": result.job, "step": result.step}
    print(json.dumps({**answer, "manifest": result.manifest}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
