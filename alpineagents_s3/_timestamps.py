"""Timestamps of S3's responses parsed in a few microseconds, not in botocore's 60 to 90.

botocore parses every timestamp of a response with ``dateutil`` (its default
``timestamp_parser``): about 60 µs for each ``LastModified`` of a listing and 90 µs for the
``Last-Modified`` header of a GET, on this machine. A listing page of 1,000 keys cost the client
~140 ms of CPU, ~90 ms of it in those timestamps; a load of a packed State, which lists the
first page of its entries before it knows they are packed, spent a fifth of its CPU there.

S3 writes two forms: ISO 8601 in UTC with milliseconds in XML bodies
(``2026-12-01T17:50:00.000Z``) and the RFC 7231 date in headers
(``Tue, 01 Dec 2026 17:50:00 GMT``). ``parse_timestamp`` reads exactly those two with the
standard library (weekday names and four-digit years from 1000 on; ~2 and ~5-12 µs) and hands
anything else to botocore's parser, so a value parses to the instant botocore's parser gives
it on a host whose local zone is UTC (a ``datetime`` in UTC; botocore's carries ``tzutc()`` or
``tzlocal()``, which compare equal).

``fast_timestamps`` gives one client this parser: a client the store made itself. Its
session's other clients, and a client given with ``client=``, are left as they are.
"""

from __future__ import annotations

import copy
import logging
import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from botocore.utils import parse_timestamp as botocore_parse_timestamp

logger = logging.getLogger("alpineagents_s3")


# The two forms S3 writes, exactly (ASCII digits only).
_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{3})?Z", re.ASCII)
# (``email.utils`` takes any word for the weekday and reads years below 100 as 19xx, where
# dateutil refuses the one and reads the other around today: both go to botocore.)
_HTTP = re.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d [A-Z][a-z]{2} [1-9]\d{3} \d\d:\d\d:\d\d GMT", re.ASCII
)


def parse_timestamp(value: Any) -> datetime:
    """A timestamp of an S3 response as an aware ``datetime``.

    ``YYYY-MM-DDTHH:MM:SS[.mmm]Z`` and ``Day, DD Mon YYYY HH:MM:SS GMT`` (a weekday's name, a
    year from 1000 on) are read here, in UTC; any other value goes to botocore's own parser, as
    does a date neither can be (a 31 April), which it refuses with its own message.
    """
    if isinstance(value, str):
        try:
            if _ISO.fullmatch(value):
                return datetime.fromisoformat(value[:-1]).replace(tzinfo=UTC)
            if _HTTP.fullmatch(value):
                return parsedate_to_datetime(value)
        except ValueError:
            pass  # botocore decides, and says what is wrong
    parsed: datetime = botocore_parse_timestamp(value)
    return parsed


def fast_timestamps(client: Any) -> None:
    """Parse the timestamps of ``client``'s responses with ``parse_timestamp``.

    The client's endpoint gets a copy of its response parser factory, so the factory it shares
    with the other clients of its session is not changed. A factory already given a
    ``timestamp_parser`` (the AWS CLI gives one) keeps it, and a client built otherwise than
    botocore and aiobotocore build theirs is left as it is.
    """
    endpoint: Any = getattr(client, "_endpoint", None)  # botocore's own attributes
    factory: Any = getattr(endpoint, "_response_parser_factory", None)
    defaults = getattr(factory, "_defaults", None)
    if not isinstance(defaults, dict) or not hasattr(factory, "create_parser"):
        logger.debug("%r: botocore's timestamp parser kept (no parser factory found)", client)
        return
    if "timestamp_parser" in defaults:
        return
    own = copy.copy(factory)
    own._defaults = {**defaults, "timestamp_parser": parse_timestamp}
    endpoint._response_parser_factory = own


def as_datetime(value: datetime | str) -> datetime:
    """A listing's ``LastModified``: a ``datetime``, or the text a session's parser left."""
    return value if isinstance(value, datetime) else parse_timestamp(value)
