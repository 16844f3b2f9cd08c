"""Making the S3 clients of one S3Store: boto3 for the sync path, aioboto3 for the async one.

Both follow the usual boto configuration (environment, ``~/.aws``, profiles, instance roles)
unless the store was given a session, endpoint or region; both get the store's retry defaults,
a connection pool as large as its concurrency, and the user's botocore event hooks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import boto3
import botocore.session
from botocore.config import Config
from botocore.configprovider import ConfiguredEndpointProvider
from botocore.exceptions import BotoCoreError

# Used unless AWS_RETRY_MODE / AWS_MAX_ATTEMPTS or the profile's config say otherwise.
DEFAULT_RETRIES: Final = {"mode": "standard", "total_max_attempts": 5}


@dataclass
class Clients:
    """How one store makes its clients (see S3Store's arguments of the same names)."""

    endpoint_url: str | None
    region_name: str | None
    max_concurrency: int
    session: Any | None  # boto3.Session
    aio_session: Any | None  # aioboto3.Session
    config: Config | None
    event_hooks: Mapping[str, Callable[..., Any]]
    on_open: Callable[[Any], None]  # told of every client opened
    describe: Callable[[], str]  # the store, for messages

    def make_sync(self) -> Any:
        """A boto3 S3 client."""
        session = self.session or boto3.Session()
        client = session.client("s3", **self._client_kwargs(session))
        self.prepare(client)
        return client

    def open_async(self) -> Any:
        """aioboto3's context manager of an S3 client (entered by the async driver)."""
        aioboto3 = self._import_aioboto3()
        if self.aio_session is None:
            # The async side follows the sync session's profile and region, if one was given.
            given = self.session
            core = botocore_session(given) if given is not None else None
            self.aio_session = aioboto3.Session(
                profile_name=core.profile if core is not None else None,
                region_name=given.region_name if given is not None else None,
            )
        return self.aio_session.client("s3", **self._client_kwargs(self.aio_session))

    def prepare(self, client: Any) -> None:
        """Register the event hooks on a client just opened, and tell the store."""
        for event, handler in self.event_hooks.items():
            client.meta.events.register(event, handler)
        self.on_open(client)

    def configured_endpoint(self, given_client: Any | None) -> str | None:
        """The endpoint the store's clients use: given, configured, or ``None`` for AWS."""
        if self.endpoint_url:
            return self.endpoint_url
        if given_client is not None:
            return str(given_client.meta.endpoint_url)
        try:
            core = botocore_session(self.session)
            provider = ConfiguredEndpointProvider(
                full_config=core.full_config,
                scoped_config=core.get_scoped_config(),
                client_name="s3",
            )
            found = provider.provide()
        except BotoCoreError:
            return None
        return str(found) if found else None

    def _client_kwargs(self, session: Any) -> dict[str, Any]:
        defaults: dict[str, Any] = {"max_pool_connections": max(10, self.max_concurrency)}
        if not _retries_configured(botocore_session(session)):
            defaults["retries"] = dict(DEFAULT_RETRIES)
        config = Config(**defaults)
        if self.config is not None:
            config = config.merge(self.config)
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": self.region_name,
            "config": config,
        }

    def _import_aioboto3(self) -> Any:
        """aioboto3, for the async methods; it is the plugin's ``async`` extra."""
        try:
            import aioboto3
        except ImportError as e:
            raise ImportError(
                f"the async methods of {self.describe()} (awrite, aread, alist, adelete, used "
                "by agent.arun) need aioboto3, which is not installed: "
                "pip install 'alpineagents-s3[async]'"
            ) from e
        return aioboto3


def botocore_session(session: Any) -> botocore.session.Session:
    """The botocore session behind a boto3/aioboto3 session (or a fresh default one)."""
    core = getattr(session, "_session", None)
    if isinstance(core, botocore.session.Session):
        return core
    return botocore.session.get_session()


def _retries_configured(core: botocore.session.Session) -> bool:
    """Whether the environment or the profile chose a retry mode or attempt count."""
    if os.environ.get("AWS_RETRY_MODE") or os.environ.get("AWS_MAX_ATTEMPTS"):
        return True
    try:
        scoped = core.get_scoped_config()
    except BotoCoreError:
        return False
    return "retry_mode" in scoped or "max_attempts" in scoped


def endpoint_identity(endpoint: str | None) -> str:
    """An endpoint as store identity: AWS's own endpoints are one S3 (bucket names are global)."""
    if not endpoint:
        return "aws"
    parts = urlsplit(endpoint)
    host = (parts.hostname or "").lower()
    if host.endswith(".amazonaws.com") or host == "amazonaws.com":
        return "aws"
    if host.endswith(".amazonaws.com.cn"):
        return "aws-cn"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"
