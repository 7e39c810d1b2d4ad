"""The project's one base exception: every error the appliance raises on purpose derives from it.

The CLI turns an ApplianceError into one sentence on stderr and an exit code;
the daemon's control API turns it into an HTTP error. Anything else that
escapes is a bug (or an engine failure) and keeps its traceback in the log.
"""

from __future__ import annotations


class ApplianceError(Exception):
    """A failure the user can act on; the message says what to change."""
