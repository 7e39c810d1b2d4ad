"""Each error kind carries its CLI exit code and HTTP status; the control API reads the attribute."""

from __future__ import annotations

import pytest

from appliance.errors import ApplianceError, DiskFullError, JobStopped
from appliance.service.control import Unauthenticated, status_of
from appliance.service.job_store import BadTransition, StoreUnwritable, UnknownJob
from appliance.service.submission import SubmissionRejected


@pytest.mark.parametrize(
    ("error", "http_status", "exit_code"),
    [
        (ApplianceError("bad input"), 400, 2),
        (UnknownJob("no job 7"), 404, 2),
        (BadTransition("done -> running"), 409, 2),
        (StoreUnwritable("disk full"), 507, 2),
        (Unauthenticated("no token"), 403, 2),
        (JobStopped("3 non-finite steps"), 400, 1),
        (DiskFullError("/data", 10, 1), 400, 1),
        (SubmissionRejected(413, "dataset too large"), 413, 2),
    ],
)
def test_the_status_and_exit_code_come_from_the_kind(error, http_status, exit_code):
    assert (status_of(error), error.exit_code) == (http_status, exit_code)
