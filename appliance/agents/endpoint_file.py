"""`<job>/endpoint.json`: where a running external-rollout job serves its student, and the token it asks for.

The worker writes it (owner-only, 0600) when its endpoint accepts and removes
it when the job ends; the daemon reads it to answer `GET /jobs/{id}/endpoint`.
Standard library only, so the daemon can read it without loading an engine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ENDPOINT_FILE = "endpoint.json"
SUBMIT_ROUTE = "/appliance/trajectories"  # beside /v1 on the endpoint: where submitted groups are checked


def write_private(path: Path, document: dict) -> None:
    """Write `document` as JSON readable by the owner only (it holds the token), atomically."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(document, handle)
    os.replace(temporary, path)


def read_endpoint_file(job_dir: Path) -> dict | None:
    """The endpoint a running external job serves ({url, token, model, pid}), or None when there is none."""
    try:
        document = json.loads((Path(job_dir) / ENDPOINT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) and {"url", "token", "model"} <= document.keys() else None
