"""Making the S3 clients of one S3Store: boto3 for the sync path, aioboto3 for the async one.

Both follow the usual boto configuration (environment, ``~/.aws``, profiles, instance roles)
unless the store was given a session, endpoint or region; both get the store's retry defaults,
a connection pool as large as its concurrency, and the user's botocore event hooks.

A store given no session makes a session of its own with its sync client (and one for its
async clients), which reads the environment, the profile and the credentials as they are at that
moment. Those sessions share their service models (see ``SharedModels``): loading them is most
of what a new session's first client costs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import boto3
import botocore.session
from botocore.config import Config
from botocore.configprovider import ConfiguredEndpointProvider
from botocore.exceptions import BotoCoreError
from botocore.loaders import Loader

# Used unless AWS_RETRY_MODE / AWS_MAX_ATTEMPTS or the profile's config say otherwise.
DEFAULT_RETRIES: Final = {"mode": "standard", "total_max_attempts": 5}

T = TypeVar("T")


class SharedModels:
    """One botocore loader per search path, shared by the sessions the stores make themselves.

    A botocore session keeps the JSON models it loads (the S3 service model, its endpoint
    rules, the partitions: ~13 MB and ~100 ms of CPU) in its loader, so every new session loads
    them again for its first client. The sessions S3Store makes (for stores given no session)
    hand their botocore session this loader instead of their own; everything else (environment,
    profile, region, credentials, event handlers) stays their own.

    Loaders are keyed by their search paths, so ``AWS_DATA_PATH`` or a profile's ``data_path``
    gets a loader of its own. The first session of a search path gives its loader, and makes
    its first client under the lock: threads that start together wait for it instead of each
    loading the same models (and, should that client's credentials come from the network, for
    them too, once). Later clients are made concurrently; the loader's cache is a dict, filled
    once and then only read, as it is when one session makes many clients.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaders: dict[tuple[type, tuple[str, ...]], Loader] = {}
        # A child forked while another thread held the lock would wait for it forever.
        if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
            os.register_at_fork(after_in_child=self._new_lock)

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    def make_client(self, session: Any, make: Callable[[], T]) -> T:
        """``make()`` a client of ``session`` (one of ours) after giving it the shared loader."""
        core = botocore_session(session)
        key = _loader_key(core)
        with self._lock:
            if key not in self._loaders:
                self._loaders[key] = core.get_component("data_loader")
                return make()
            shared = self._loaders[key]
        core.register_component("data_loader", shared)
        return make()

    def adopt(self, session: Any) -> None:
        """Give ``session`` (one of ours) the shared loader, or make its loader the shared one.

        For aioboto3 sessions, whose clients are made later, in an event loop.
        """
        core = botocore_session(session)
        key = _loader_key(core)
        own = core.get_component("data_loader")
        with self._lock:
            shared = self._loaders.setdefault(key, own)
        if shared is not own:
            core.register_component("data_loader", shared)

    def clear(self) -> None:
        """Forget the loaders (the next session's loader becomes the shared one again)."""
        with self._lock:
            self._loaders.clear()


def _loader_key(core: botocore.session.Session) -> tuple[type, tuple[str, ...]]:
    loader = core.get_component("data_loader")
    return type(loader), tuple(loader.search_paths)


#: The process's shared models (see SharedModels).
MODELS: Final = SharedModels()


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
        """A boto3 S3 client: of the given session, else of a new one with the shared models."""
        if self.session is not None:
            client = self.session.client("s3", **self._client_kwargs(self.session))
        else:
            session = boto3.Session()
            client = MODELS.make_client(
                session, lambda: session.client("s3", **self._client_kwargs(session))
            )
        self.prepare(client)
        return client

    def open_async(self) -> Any:
        """aioboto3's context manager of an S3 client (entered by the async driver)."""
        aioboto3 = self._import_aioboto3()
        if self.aio_session is None:
            # The async side follows the sync session's profile and region, if one was given.
            given = self.session
            core = botocore_session(given) if given is not None else None
            made = aioboto3.Session(
                profile_name=core.profile if core is not None else None,
                region_name=given.region_name if given is not None else None,
            )
            MODELS.adopt(made)
            self.aio_session = made
        kwargs = self._client_kwargs(self.aio_session)
        kwargs["config"] = self._aio_config(kwargs["config"])
        return self.aio_session.client("s3", **kwargs)

    def prepare(self, client: Any) -> None:
        """Prepare a client just opened: the event hooks; then tell the store."""
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

    def pool_size(self) -> int:
        """The connection pool of the clients this makes (``max_pool_connections``)."""
        config = self._merged_config()
        return int(getattr(config, "max_pool_connections", None) or 10)

    def _merged_config(self, **defaults: Any) -> Config:
        """The store's defaults (the pool, and ``defaults``) with ``config`` over them."""
        config = Config(max_pool_connections=max(10, self.max_concurrency), **defaults)
        if self.config is not None:
            config = config.merge(self.config)
        return config

    def _client_kwargs(self, session: Any) -> dict[str, Any]:
        retries = {}
        if not _retries_configured(botocore_session(session)):
            retries["retries"] = dict(DEFAULT_RETRIES)
        config = self._merged_config(**retries)
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": self.region_name,
            "config": config,
        }

    def _aio_config(self, merged: Config) -> Any:
        """``merged`` as an aiobotocore ``AioConfig``, for an async client.

        It has the connector arguments and http session class of the ``AioConfig`` given as
        ``config`` (a merge of botocore Configs keeps neither).
        """
        from aiobotocore.config import AioConfig

        given = self.config if isinstance(self.config, AioConfig) else None
        options: dict[str, Any] = getattr(merged, "_user_provided_options", {})
        extra: dict[str, Any] = {}
        session_cls = getattr(given, "http_session_cls", None)
        if session_cls is not None:
            extra["http_session_cls"] = session_cls
        return AioConfig(getattr(given, "connector_args", None), **options, **extra)

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
