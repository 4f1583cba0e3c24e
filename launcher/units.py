"""What a size or a group given by a user means on this machine: bytes from ``512M``, a group's id
from its name or number. Pure lookups with no option's name in them: :mod:`launcher.options` and
the cluster file put the option's or key's name in front of the ValueError's words."""

from __future__ import annotations

import os
import re
from typing import Any

from .masking import masked_text

LOG_SIZE_RANGE = (64 << 10, 1 << 50)  # the sizes a log limit may have: 64k to 1024T


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``512M``, ``2G``, ``100k``, ``1.5GiB``, ``1048576`` as bytes (k, M, G and T are powers of 1024),
    within :data:`LOG_SIZE_RANGE`; ValueError saying what was expected otherwise."""
    match = _SIZE.fullmatch(str(text).strip())
    if match is None:
        raise ValueError(f"expected a size such as 512M, 2G or 100k, got {text!r}")
    try:
        value = int(float(match[1]) * _UNITS[match[2].lower()])
    except OverflowError:  # more digits than a float holds
        value = LOG_SIZE_RANGE[1] + 1
    if not LOG_SIZE_RANGE[0] <= value <= LOG_SIZE_RANGE[1]:
        raise ValueError(f"expected a size from 64k to 1024T, got {text!r}")
    return value


def group_id(group: Any) -> int:
    """The id of ``group`` (a name, or a number as text or int) that this user may give a run folder:
    one it is a member of (root: any). ValueError saying why not, naming the value, otherwise."""
    import grp

    if isinstance(group, bool) or not isinstance(group, (str, int)) or str(group).strip() == "":
        raise ValueError(f"expected the name or number of a group, got {masked_text(repr(group))}")
    text = str(group).strip()
    try:
        gid = grp.getgrgid(int(text)).gr_gid if text.isascii() and text.isdecimal() else grp.getgrnam(text).gr_gid
    except (KeyError, OverflowError):
        raise ValueError(f"no group {text!r} on this machine") from None
    if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        raise ValueError(f"you are not a member of group {text!r} (gid {gid}), so a run folder cannot be given it")
    return gid
