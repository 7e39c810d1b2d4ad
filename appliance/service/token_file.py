"""The control API's bearer token: read from a file only its owner can read, on both ends.

`appliance serve --control-addr HOST:PORT --control-token-file FILE` opens a
TCP listener that answers only requests carrying `Authorization: Bearer
<token>`; `appliance jobs --control-addr HOST:PORT --token-file FILE` sends
it. The same rules hold on both ends: a regular file, no access for group or
others (like ssh's private keys), one line of at least MIN_TOKEN_CHARS
visible ASCII characters.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from appliance.errors import ApplianceError

MIN_TOKEN_CHARS = 16  # too short to guess over the network; MAKE_ONE writes far more
MAKE_ONE = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE && chmod 600 FILE"


class TokenFileError(ApplianceError):
    """The token file is missing, readable by others, empty or malformed; the message says what to do."""


def read_token_file(path: str | Path, option: str = "--control-token-file") -> str:
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise TokenFileError(f"{option} {path}: not a regular file; write the token into a file")
            if info.st_mode & 0o077:
                raise TokenFileError(
                    f"{option} {path}: readable or writable by group or others (mode "
                    f"{stat.S_IMODE(info.st_mode):04o}); restrict it with: chmod 600 {path}"
                )
            data = handle.read(4096)
    except FileNotFoundError:
        raise TokenFileError(
            f"{option} {path}: no such file; create one with: {MAKE_ONE.replace('FILE', str(path))}"
        ) from None
    except PermissionError:
        raise TokenFileError(f"{option} {path}: permission denied; the file must be readable by this user") from None
    except IsADirectoryError:
        raise TokenFileError(f"{option} {path}: is a folder; name the file that holds the token") from None
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenFileError(f"{option} {path}: the token must be ASCII text") from None
    if not token:
        raise TokenFileError(
            f"{option} {path}: the file is empty; put a token in it: {MAKE_ONE.replace('FILE', str(path))}"
        )
    if len(token) < MIN_TOKEN_CHARS or any(not 0x21 <= ord(char) <= 0x7E for char in token):
        raise TokenFileError(
            f"{option} {path}: the token must be one line of at least {MIN_TOKEN_CHARS} visible "
            f"characters without spaces; make one with: {MAKE_ONE.replace('FILE', str(path))}"
        )
    return token
