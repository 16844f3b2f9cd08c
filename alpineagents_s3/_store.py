"""S3Store: States in an S3 bucket, on boto3 (sync) and aioboto3 (async)."""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self
from urllib.parse import urlsplit

import boto3
import botocore.session
from botocore.config import Config
from botocore.configprovider import ConfiguredEndpointProvider
from botocore.exceptions import BotoCoreError

from alpineagents_s3._async import AsyncDriver
from alpineagents_s3._contract import Record, Store, Summary
from alpineagents_s3._protocol import Protocol, StoredObject
from alpineagents_s3._sync import SyncDriver

if TYPE_CHECKING:
    import aioboto3
    from types_boto3_s3 import S3Client

__all__ = ["S3Store"]

_SSE_MODES: Final = ("AES256", "aws:kms", "aws:kms:dsse")
# Used unless AWS_RETRY_MODE / AWS_MAX_ATTEMPTS or the profile's config say otherwise.
DEFAULT_RETRIES: Final = {"mode": "standard", "total_max_attempts": 5}

EventHook = Callable[..., Any]


class S3Store(Store):
    """Keeps each State under ``s3://bucket/prefix/<id>/``, with conditional PUTs.

    Each history entry is an object of its own, and the rest of the State one snapshot object.

    The sync methods use boto3, the async ones aioboto3 (an aiobotocore client opened in the
    running event loop, closed by ``aclose()`` or ``async with store``). Credentials, region,
    profile and endpoint come from the usual boto configuration (environment variables such as
    ``AWS_PROFILE`` and ``AWS_ENDPOINT_URL_S3``, ``~/.aws``, instance roles) unless given here.

    A history entry is written once and never replaced (only orphans, entries beyond a gap left
    by a save killed during its parallel entry PUTs, are: a load leaves them out, the next save
    replaces or deletes them). A new State's snapshot is created only if the id is free (else
    ``ValueError``); later snapshots replace only the version this store object last wrote or
    read, so a second process running the same State gets ``ConcurrentWriteError`` instead of
    overwriting it.

    A ``load`` that finds the snapshot this store object holds changes nothing (a monitor may
    load a running State through the run's store). One that finds another process's snapshot
    makes it the version to replace, for the State it returns; a save of a copy held from
    before is then refused when it continues from an earlier entry than that load saw. The
    store cannot tell copies apart beyond that (it sees ids, entries and snapshots, not
    copies): if the other process's save added no entry, the older copy's save is taken for
    the loaded one's. Watch running States through a store object of their own to rule that
    out. See docs/s3.md, "Two processes, one State".

    Args:
        bucket: The bucket; it must exist.
        prefix: A folder in the bucket for the States (``"runs"`` keeps them under ``runs/``).
        endpoint_url: An S3-compatible endpoint (LocalStack, moto, MinIO, ...). Default: the
            configured one (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the profile), else AWS.
        region_name: Default: the configured region.
        client: A boto3 S3 client for the sync methods (not closed by the store).
        session: A ``boto3.Session`` to make the sync client with (e.g. a profile).
        aio_session: An ``aioboto3.Session`` to make the async clients with. Default: one
            with the profile and region of ``session``, if given.
        config: A ``botocore.config.Config`` merged over the store's defaults: retries in
            botocore's ``standard`` mode, 5 attempts (unless ``AWS_RETRY_MODE`` or
            ``AWS_MAX_ATTEMPTS`` or the profile set them), and a connection pool as large as
            ``max_concurrency``. ``Config(retries={"mode": "adaptive"})`` adds client-side rate
            limiting under throttling.
        max_concurrency: At most this many requests at once per operation (entry PUTs of one
            save, entry GETs of one load, snapshot GETs of one list).
        server_side_encryption: ``"AES256"`` (SSE-S3), ``"aws:kms"`` or ``"aws:kms:dsse"``,
            sent with every PUT.
        sse_kms_key_id: The KMS key for SSE-KMS, sent with every PUT (implies ``"aws:kms"``).
        event_hooks: botocore event handlers (``{"before-send.s3": handler}``) registered on
            every client the store opens, sync and async.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        client: S3Client | None = None,
        session: boto3.Session | None = None,
        aio_session: aioboto3.Session | None = None,
        config: Config | None = None,
        max_concurrency: int = 16,
        server_side_encryption: str | None = None,
        sse_kms_key_id: str | None = None,
        event_hooks: Mapping[str, EventHook] | None = None,
    ):
        if not bucket or "/" in bucket:
            raise ValueError(f"invalid bucket name {bucket!r}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency}")
        if sse_kms_key_id and server_side_encryption is None:
            server_side_encryption = "aws:kms"
        if server_side_encryption is not None and server_side_encryption not in _SSE_MODES:
            raise ValueError(
                f"server_side_encryption must be one of {_SSE_MODES}, not "
                f"{server_side_encryption!r}"
            )
        if sse_kms_key_id and not str(server_side_encryption).startswith("aws:kms"):
            raise ValueError("sse_kms_key_id needs server_side_encryption='aws:kms'")
        root = prefix.strip("/")
        if "//" in root:
            raise ValueError(f"invalid prefix {prefix!r}: it has an empty folder name")

        self.bucket = bucket
        self.prefix = f"{root}/" if root else ""
        self.endpoint_url = endpoint_url
        self.region_name = region_name
        self.max_concurrency = max_concurrency
        self._session = session
        self._aio_session = aio_session
        self._config = config
        self._event_hooks = dict(event_hooks or {})
        self._identity: tuple[str, str, str] | None = None
        sse: dict[str, str] = {}
        if server_side_encryption:
            sse["ServerSideEncryption"] = server_side_encryption
        if sse_kms_key_id:
            sse["SSEKMSKeyId"] = sse_kms_key_id
        self._protocol = Protocol(
            bucket=bucket,
            root=self.prefix,
            endpoint=endpoint_url or (client.meta.endpoint_url if client else "the S3 endpoint"),
            sse=sse,
        )
        self._sync = SyncDriver(self._make_client, max_concurrency, client)
        self._async = AsyncDriver(self._open_aio_client, max_concurrency, self._opened)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Store:
        """``S3Store.from_url("s3://bucket/prefix", **options)``; ``open_store`` uses it."""
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
            raise ValueError(f"not an S3Store URL: {url!r} (expected s3://bucket/prefix)")
        return cls(parts.netloc, parts.path, **options)

    # Identity --------------------------------------------------------------------------

    def __repr__(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}"
        endpoint = self._key()[0]
        return f"S3Store({where!r})" if endpoint == "aws" else f"S3Store({where!r}, {endpoint})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, S3Store) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(("S3Store", *self._key()))

    def _key(self) -> tuple[str, str, str]:
        """(endpoint, bucket, prefix): two stores with the same key are the same store."""
        if self._identity is None:
            self._identity = (
                _endpoint_identity(self._configured_endpoint()),
                self.bucket,
                self.prefix,
            )
        return self._identity

    def _configured_endpoint(self) -> str | None:
        if self.endpoint_url:
            return self.endpoint_url
        given = self._sync._given
        if given is not None:
            return str(given.meta.endpoint_url)
        try:
            core = self._botocore_session(self._session)
            provider = ConfiguredEndpointProvider(
                full_config=core.full_config,
                scoped_config=core.get_scoped_config(),
                client_name="s3",
            )
            found = provider.provide()
        except BotoCoreError:
            return None
        return str(found) if found else None

    # Clients ---------------------------------------------------------------------------

    @property
    def client(self) -> S3Client:
        """The boto3 S3 client of the sync methods, made at first use."""
        client: S3Client = self._sync.client
        return client

    def _client_kwargs(self, session: Any) -> dict[str, Any]:
        defaults: dict[str, Any] = {"max_pool_connections": max(10, self.max_concurrency)}
        if not _retries_configured(self._botocore_session(session)):
            defaults["retries"] = dict(DEFAULT_RETRIES)
        config = Config(**defaults)
        if self._config is not None:
            config = config.merge(self._config)
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": self.region_name,
            "config": config,
        }

    def _make_client(self) -> S3Client:
        session = self._session or boto3.Session()
        client: S3Client = session.client("s3", **self._client_kwargs(session))
        self._opened(client)
        return client

    def _open_aio_client(self) -> Any:
        aioboto3 = _import_aioboto3(self)
        if self._aio_session is None:
            # The async side follows the sync session's profile and region, if one was given.
            given = self._session
            core = self._botocore_session(given) if given is not None else None
            self._aio_session = aioboto3.Session(
                profile_name=core.profile if core is not None else None,
                region_name=given.region_name if given is not None else None,
            )
        session = self._aio_session
        return session.client("s3", **self._client_kwargs(session))

    def _opened(self, client: Any) -> None:
        """Prepare a client the store has just opened."""
        self._protocol.endpoint = str(client.meta.endpoint_url)
        for event, handler in self._event_hooks.items():
            client.meta.events.register(event, handler)

    @staticmethod
    def _botocore_session(session: Any) -> botocore.session.Session:
        core = getattr(session, "_session", None)
        if isinstance(core, botocore.session.Session):
            return core
        return botocore.session.get_session()

    # The sync methods ------------------------------------------------------------------

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        """PUT the entries the bucket lacks in parallel, then the snapshot (unless ``None``).

        ``snapshot`` is the snapshot dict (alpineagents 0.2-0.4 and this repository's core;
        ``None`` keeps the stored one) or the info dict (0.5+); the store does not look
        inside it.
        """
        self._sync.run(self._protocol.write(state_id, entries, snapshot, create))

    def read(self, state_id: str) -> Record | None:
        """The snapshot and every entry, fetched concurrently; ``None`` for an unknown id."""
        return self._sync.run(self._protocol.read(state_id))

    def load(self, state_id: str) -> Any:
        """The core's ``load``; an error of the core about what is stored names where it is."""
        try:
            return super().load(state_id)
        except Exception as e:
            self._note_where(e, state_id)
            raise

    async def aload(self, state_id: str) -> Any:
        """The core's ``aload``; an error of the core about what is stored names where it is."""
        try:
            return await super().aload(state_id)
        except Exception as e:
            self._note_where(e, state_id)
            raise

    def _note_where(self, error: Exception, state_id: str) -> None:
        """Name the State's objects on an error about them (not on an unknown id)."""
        if "s3://" not in str(error) and not isinstance(error, LookupError):
            where = self._protocol.url(self._protocol.state_prefix(state_id))
            error.add_note(f"State {state_id!r} is stored under {where}")

    def list(self) -> builtins.list[Summary]:
        """The saved States, most recently updated first.

        Each is the installed alpineagents' own summary: ``SavedState`` (0.2-0.4 and this
        repository's core) or ``StateInfo`` (0.5+).
        """
        return self._sync.run(self._protocol.list_states())

    def delete(self, state_id: str) -> None:
        """Delete every object of a State (snapshot first); ``KeyError`` if there is none."""
        self._sync.run(self._protocol.delete(state_id))

    def objects(self, state_id: str) -> builtins.list[StoredObject]:
        """Every object under the State's prefix, with its size and role, in key order."""
        return self._sync.run(self._protocol.objects(state_id))

    def close(self) -> None:
        """Close the boto3 client and thread pool. The store opens them again if used."""
        self._sync.close()
        self._async.forget_ended_loops()

    # The async twins -------------------------------------------------------------------

    async def awrite(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        """Async ``write``, on aioboto3."""
        await self._async.run(self._protocol.write(state_id, entries, snapshot, create))

    async def aread(self, state_id: str) -> Record | None:
        """Async ``read``, on aioboto3."""
        return await self._async.run(self._protocol.read(state_id))

    async def alist(self) -> builtins.list[Summary]:
        """Async ``list``, on aioboto3."""
        return await self._async.run(self._protocol.list_states())

    async def adelete(self, state_id: str) -> None:
        """Async ``delete``, on aioboto3."""
        await self._async.run(self._protocol.delete(state_id))

    async def aobjects(self, state_id: str) -> builtins.list[StoredObject]:
        """Async ``objects``, on aioboto3."""
        return await self._async.run(self._protocol.objects(state_id))

    async def aclose(self) -> None:
        """Close the aioboto3 client of the running event loop, and the sync client."""
        await self._async.aclose()
        self._sync.close()

    # Context managers (the published Store base has none) ------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _import_aioboto3(store: S3Store) -> Any:
    """aioboto3, for the async methods; it is the plugin's ``async`` extra."""
    try:
        import aioboto3
    except ImportError as e:
        raise ImportError(
            f"the async methods of {store!r} (awrite, aread, alist, adelete, used by "
            "agent.arun) need aioboto3, which is not installed: "
            "pip install 'alpineagents-s3[async]'"
        ) from e
    return aioboto3


def _retries_configured(core: botocore.session.Session) -> bool:
    """Whether the environment or the profile chose a retry mode or attempt count."""
    if os.environ.get("AWS_RETRY_MODE") or os.environ.get("AWS_MAX_ATTEMPTS"):
        return True
    try:
        scoped = core.get_scoped_config()
    except BotoCoreError:
        return False
    return "retry_mode" in scoped or "max_attempts" in scoped


def _endpoint_identity(endpoint: str | None) -> str:
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
