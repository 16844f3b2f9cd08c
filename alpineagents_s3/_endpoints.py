"""Endpoint resolution that botocore's cache answers for every key, not once per key.

Before each request botocore resolves its endpoint by evaluating S3's endpoint ruleset over the
request's parameters, and caches the result by those parameters, 100 results for the whole
process. They include the object's ``Key`` (and a copy's ``CopySource``), which no rule of the
ruleset reads: the cache missed for every new key, and a request of the store (almost always for
a key it has not sent before) paid the whole evaluation, ~350-450 µs of CPU on this machine
against ~60 µs for a hit.

``cache_endpoints`` gives one client an endpoint provider that leaves out of the cache's key
(and of the evaluation) the parameters whose names are nowhere in its ruleset's rules, and that
the ruleset neither requires nor marks deprecated: no rule can tell their values apart, so the
endpoint is the one botocore resolves. A value of the wrong type is still passed on, for
botocore to refuse, and a resolution that fails is made again with every parameter, for its
error to be botocore's. A parameter the rules name, in this or a later botocore, is kept
(``Prefix`` is, being part of the name ``regionPrefix``). Only a client the store made is
changed: its session's other clients and a client given with ``client=`` resolve as botocore
does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import EndpointProviderError

logger = logging.getLogger("alpineagents_s3")


class UnkeyedProvider:
    """An endpoint provider that resolves without the parameters ``unused`` names.

    ``unused`` maps each such parameter to the type its ruleset declares: a value of another
    type is passed on, so that botocore refuses it as it would. An error of the resolution is
    resolved again with every parameter, so that its message is botocore's to the letter.
    """

    def __init__(self, provider: Any, unused: Mapping[str, type]):
        self.provider = provider
        self.unused = dict(unused)

    def resolve_endpoint(self, **params: Any) -> Any:
        """The (cached) endpoint of botocore's provider for ``params`` but the ``unused`` ones."""
        kept = {
            name: value
            for name, value in params.items()
            if not (name in self.unused and isinstance(value, self.unused[name]))
        }
        try:
            return self.provider.resolve_endpoint(**kept)
        except EndpointProviderError:
            if len(kept) == len(params):
                raise
            return self.provider.resolve_endpoint(**params)

    def __getattr__(self, name: str) -> Any:  # the ruleset, and anything botocore adds
        if name in ("provider", "unused") or name.startswith("__"):
            raise AttributeError(name)  # not set yet: a copy being made
        return getattr(self.provider, name)


def unused_parameters(ruleset: Any) -> dict[str, type]:
    """The parameters of a parsed endpoint ruleset (botocore's ``RuleSet``) its rules never name.

    A parameter is left out only if its name is in no string of the rules (a ``ref``, a
    ``{Template}``, an ``assign``, a documentation, a part of a longer word), so that no rule
    can read it, and if the ruleset neither requires it nor marks it deprecated (botocore checks
    and logs those before any rule). The rules are written out as JSON to look (~3 ms for S3's
    on this machine), which keeps every letter of their strings as it is. Returns each one's
    declared type.
    """
    text = json.dumps(ruleset.rules, default=vars, ensure_ascii=False, check_circular=True)
    return {
        name: definition.parameter_type
        for name, definition in ruleset.parameters.items()
        if name not in text
        and not definition.required
        and definition.deprecated is None
        and isinstance(definition.parameter_type, type)
    }


def cache_endpoints(client: Any) -> None:
    """Let botocore's endpoint cache answer ``client``'s requests whatever their key.

    A client whose resolver is not built as botocore 1.28+ (and aiobotocore) builds it, or whose
    ruleset names every parameter, is left as it is.
    """
    resolver: Any = getattr(client, "_ruleset_resolver", None)  # botocore's own attributes
    provider: Any = getattr(resolver, "_provider", None)
    if isinstance(provider, UnkeyedProvider):
        return
    ruleset: Any = getattr(provider, "ruleset", None)
    try:
        unused = unused_parameters(ruleset)
    except (AttributeError, TypeError, ValueError, RecursionError):
        logger.debug("%r: botocore's endpoint resolution kept (no ruleset found)", client)
        return
    if unused:
        resolver._provider = UnkeyedProvider(provider, unused)
