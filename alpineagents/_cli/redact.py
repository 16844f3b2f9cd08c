"""Keeping secrets out of what ``alpineagents`` prints about stores and errors.

A store URL or an endpoint may carry user info (``http://KEY:SECRET@host``), and so may the
messages and reprs that name them (botocore's errors name the endpoint). Everything the
command prints about a store or an error goes through :func:`redact`; the data of a State it
prints (``show``, ``export``) is the user's and is printed as it is.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["redact", "shown"]

# scheme://userinfo@ : the user info ends at the first "@"; a password may hold "/" (an AWS
# secret key does), a user name without a password may not (it would run into the path).
_USERINFO: Final = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)"
    r"(?P<info>[^\s/@'\"<>]*:[^\s@'\"<>]*|[^\s/:@'\"<>]+)@"
)


def redact(text: str) -> str:
    """``text`` with the user info of every URL in it replaced by ``***``."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


def shown(store: object) -> str:
    """A store's repr, for a message: without user info."""
    return redact(repr(store))
