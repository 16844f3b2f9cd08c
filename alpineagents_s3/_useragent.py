"""The User-Agent header of a store's requests, built once for each set of features.

botocore builds the header twice for every request (as the request is made, and again as it
is sent, to add what the request registered on the way), each time from some thirty parts that
it cleans character by character: ~0.1 ms a time on this machine, an eighth of the client's
CPU for a small GET. All it is built from is fixed when the client is made (the SDK's and
Python's versions, the platform, the client's config, the session's extra text, the app id),
except the *features*: those of the client and those the request registered in its context
(retry mode, checksums, a paginator's). ``cache_user_agent`` gives one client a builder that
keeps, for each such set of features, the header botocore's own builder made for it: the same
header, but for the order of the features in its ``m/`` part, which botocore writes in the
order of a Python set (the same set may come out in another order for a request that added
them in another order; S3 reads them as a set). Only a client the store made is changed; its
session's other clients and a client given with ``client=`` build theirs as botocore does.
What the header is built from is read when the client is made, as botocore reads it: a
change to the client's config after that (which botocore does not expect) is not seen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from botocore.context import get_context

logger = logging.getLogger("alpineagents_s3")

# Sets of features kept per client; a request registers few, and few combinations occur.
KEPT = 32


def cache_user_agent(client: Any) -> None:
    """Build ``client``'s User-Agent header once per set of features (see the module).

    A client whose builder is not botocore's ``UserAgentString`` as botocore 1.36+ (and
    aiobotocore) make it, with a features set of its own, is left as it is.
    """
    creator: Any = getattr(client, "_user_agent_creator", None)  # botocore's own attributes
    build = getattr(creator, "to_string", None)
    if (
        not callable(build)
        or not hasattr(creator, "_client_features")
        or not isinstance(getattr(creator, "__dict__", None), dict)
    ):
        logger.debug("%r: botocore's User-Agent builder kept", client)
        return
    if "to_string" not in vars(creator):  # not changed already
        creator.to_string = _cached(creator, build)


def _cached(creator: Any, build: Callable[[], str]) -> Callable[[], str]:
    """``build`` (botocore's ``to_string`` of ``creator``), kept by the features it reads."""
    kept: dict[tuple[frozenset[str], frozenset[str]], str] = {}

    def to_string() -> str:
        context = get_context()
        features = getattr(context, "features", None) or ()
        key = (frozenset(creator._client_features or ()), frozenset(features))
        header = kept.get(key)
        if header is None:
            header = build()
            if len(kept) >= KEPT:
                kept.clear()
            kept[key] = header
        return header

    return to_string
