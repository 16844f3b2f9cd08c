"""S3Store: States in an S3 bucket, on boto3 (sync) and aioboto3 (async)."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar
from urllib.parse import urlsplit

from botocore.config import Config

from alpineagents_s3._async import AsyncDriver
from alpineagents_s3._clients import Clients, endpoint_identity
from alpineagents_s3._contract import Record, Store, Summary
from alpineagents_s3._deleting import delete
from alpineagents_s3._layout import Layout
from alpineagents_s3._packing import Packed, pack, read_and_pack
from alpineagents_s3._reading import StoredObject, list_states, objects, read
from alpineagents_s3._steps import Steps
from alpineagents_s3._sweeping import SWEEP_AGE, sweep
from alpineagents_s3._sync import SyncDriver
from alpineagents_s3._versions import Ledger
from alpineagents_s3._writing import write
from alpineagents_s3.errors import StoreClosedError

if TYPE_CHECKING:
    import aioboto3
    import boto3
    from types_boto3_s3 import S3Client

__all__ = ["S3Store"]

_SSE_MODES: Final = ("AES256", "aws:kms", "aws:kms:dsse")

EventHook = Callable[..., Any]
T = TypeVar("T")


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
        session: A ``boto3.Session`` to make the sync client with (e.g. a profile). Default:
            a new session made with the sync client, so the environment, profile and
            credentials are read as they are then (the async side makes one of its own). The
            sessions stores make share the service models the process has loaded: the first
            client loads them (~13 MB), later stores' clients do not.
        aio_session: An ``aioboto3.Session`` to make the async clients with. Default: one
            with the profile and region of ``session``, if given.
        config: A ``botocore.config.Config`` merged over the store's defaults: retries in
            botocore's ``standard`` mode, 5 attempts (unless ``AWS_RETRY_MODE`` or
            ``AWS_MAX_ATTEMPTS`` or the profile set them), and a connection pool as large as
            ``max_concurrency``. ``Config(retries={"mode": "adaptive"})`` adds client-side rate
            limiting under throttling. An aiobotocore ``AioConfig`` also gives the async
            clients its ``connector_args`` and ``http_session_cls``. The async clients share
            one TLS context per CA bundle in the process (unless a proxy, a client
            certificate or an ``http_session_cls`` of your own is configured), so a client
            opened in a new event loop does not load the CA bundle again; it checks host
            names, as the sync clients do.
        max_concurrency: At most this many requests at once per operation (entry PUTs of one
            save, entry GETs of one load, snapshot GETs of one list). 32 by default: a first
            load's second round of a State packed as loads go (``auto_pack=16``) sends up to
            18 requests, and a warm load's first round the known segments and up to 35 more
            (32 entries, the snapshot and two listings); those over the limit wait for one to
            finish, a round trip more. Never more than the connection pool holds: a
            ``config`` with a smaller ``max_pool_connections``, or a ``client=`` (botocore's
            pool is 10 unless its config says otherwise), lowers it to that.
        server_side_encryption: ``"AES256"`` (SSE-S3), ``"aws:kms"`` or ``"aws:kms:dsse"``,
            sent with every PUT.
        sse_kms_key_id: The KMS key for SSE-KMS, sent with every PUT (implies ``"aws:kms"``).
        event_hooks: botocore event handlers (``{"before-send.s3": handler}``) registered on
            every client the store opens, sync and async.
        auto_pack: Pack as a load goes: a load that fetched this many or more of the entries
            the snapshot counts one object each also packs them (as ``pack()``, entry objects
            kept), from what it read: one PUT per new segment and one HEAD, no GET more, so
            the next load of the State reads a few segments. The load returns what it read
            even if that pack fails (say, credentials that may only read): a warning is
            logged. Default ``None``: a load writes nothing. See docs/s3.md, "Packed
            segments".
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
        max_concurrency: int = 32,
        server_side_encryption: str | None = None,
        sse_kms_key_id: str | None = None,
        event_hooks: Mapping[str, EventHook] | None = None,
        auto_pack: int | None = None,
    ):
        if not bucket or "/" in bucket:
            raise ValueError(f"invalid bucket name {bucket!r}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency}")
        if auto_pack is not None and (
            not isinstance(auto_pack, int) or isinstance(auto_pack, bool) or auto_pack < 1
        ):
            raise ValueError(
                f"auto_pack must be None or a number of entries of at least 1, not {auto_pack!r}"
            )
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
        self.auto_pack = auto_pack
        self._clients = Clients(
            endpoint_url=endpoint_url,
            region_name=region_name,
            max_concurrency=max_concurrency,
            session=session,
            aio_session=aio_session,
            config=config,
            event_hooks=dict(event_hooks or {}),
            on_open=self._opened,
            describe=lambda: repr(self),
        )
        self._given_client = client
        self._identity: tuple[str, str, str] | None = None
        sse: dict[str, str] = {}
        if server_side_encryption:
            sse["ServerSideEncryption"] = server_side_encryption
        if sse_kms_key_id:
            sse["SSEKMSKeyId"] = sse_kms_key_id
        self._closed = False
        self._ledger = Ledger()
        self._layout = Layout(
            bucket=bucket,
            root=self.prefix,
            endpoint=endpoint_url or (client.meta.endpoint_url if client else "the S3 endpoint"),
            sse=sse,
        )
        # No more requests at once than the client has connections: urllib3 would open more
        # (a TLS handshake each) and drop them again, warning that its pool is full.
        ours = min(max_concurrency, self._clients.pool_size())
        sync_limit = ours if client is None else min(max_concurrency, _pool_of(client))
        self._sync = SyncDriver(self._clients.make_sync, sync_limit, client)
        self._async = AsyncDriver(self._clients.open_async, ours, self._clients.prepare)

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
                endpoint_identity(self._clients.configured_endpoint(self._given_client)),
                self.bucket,
                self.prefix,
            )
        return self._identity

    # Clients ---------------------------------------------------------------------------

    @property
    def client(self) -> S3Client:
        """The boto3 S3 client of the sync methods, made at first use."""
        self._check_open()
        client: S3Client = self._sync.client
        return client

    def _opened(self, client: Any) -> None:
        """Prepare a client the store has just opened: messages name its endpoint."""
        self._layout = replace(self._layout, endpoint=str(client.meta.endpoint_url))

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
        self._sync.run(self._steps(write, self._ledger, state_id, entries, snapshot, create))

    def read(self, state_id: str) -> Record | None:
        """The snapshot and every entry, fetched concurrently; ``None`` for an unknown id.

        With ``auto_pack``, a read that fetched that many entry objects also packs them.
        """
        return self._sync.run(self._reading(state_id))

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
            where = self._layout.url(self._layout.state_prefix(state_id))
            error.add_note(f"State {state_id!r} is stored under {where}")

    def list(self) -> builtins.list[Summary]:
        """The saved States, most recently updated first.

        Each is the installed alpineagents' own summary: ``SavedState`` (0.2-0.4 and this
        repository's core) or ``StateInfo`` (0.5+).
        """
        return self._sync.run(self._steps(list_states))

    def delete(self, state_id: str) -> None:
        """Delete every object of a State (snapshot first); ``KeyError`` if there is none."""
        self._sync.run(self._steps(delete, self._ledger, state_id))

    def objects(self, state_id: str) -> builtins.list[StoredObject]:
        """Every object under the State's prefix, with its size and role, in key order."""
        return self._sync.run(self._steps(objects, state_id))

    def pack(self, state_id: str, *, remove_entries: bool = False) -> Packed:
        """Pack the State's saved entries into a few large objects, so it loads in 2 or 3 rounds.

        The entries the stored snapshot counts are written into *packed segments*, objects of
        at least 128 KiB (or one object, for a smaller State), each written once with
        ``If-None-Match: *``. A load then reads the snapshot, the segments and the entries
        saved after the pack: 2 rounds of requests, 3 with entries saved alone after the
        snapshot or more than 100 since the pack, up to 1,000 segments (about 1 GB) and 1,000
        entries since the pack (each 1,000 more of either adds a listing round); a round less
        through a store object that read (or packed) the State before, which GETs the
        segments it knows with the snapshot.
        Packing again packs what was saved since, merging small segments into larger ones so
        that a State keeps a few. It is safe while the State is being run: only entries that
        are final are packed, and no save waits for it or is refused because of it.

        ``remove_entries=True`` also removes the entry objects the segments cover (archiving:
        a finished State becomes its snapshot and a few large objects, which lifecycle rules
        can move to colder storage classes). Readers then need this alpineagents-s3 or later.

        Raises ``StateNotFoundError`` (a ``KeyError``) for an unknown id, also when the State
        is deleted while being packed (the segments written are removed again).
        """
        return self._sync.run(self._steps(pack, state_id, remove_entries, self._ledger))

    def sweep(self, older_than: float = SWEEP_AGE) -> builtins.list[str]:
        """Remove what creates that died left behind; return the keys removed.

        A create writes a State's first entries under a new *generation*, then the snapshot
        that names it. One killed in between (or that lost a race and died before cleaning
        up) leaves entries no snapshot names: never read, kept until the State is deleted, or
        for good when no State was created. This removes every such generation whose newest
        object is older than ``older_than`` seconds (by this machine's clock; default one
        day), so a create under way is never touched. Run it from a scheduled job.

        It lists the whole prefix (1 request per 1,000 objects) and HEADs the snapshot of
        each State that has entries. Entries of the State's own generation are left (a save
        that was stopped left them pending: the State's next save replaces them), and so are
        keys S3Store did not name.
        """
        return self._sync.run(self._steps(sweep, older_than))

    def close(self) -> None:
        """Close the boto3 client and thread pool; the store refuses any later use.

        Async clients of event loops that have ended were closed with their loop; one of a loop
        still running is closed by ``aclose()`` in that loop.
        """
        self._closed = True
        self._sync.close()
        self._async.forget_ended_loops()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` or ``aclose()`` was called."""
        return self._closed

    def _steps(self, operation: Callable[..., Steps[T]], *args: Any) -> Steps[T]:
        """The steps of an operation on this store's layout; refused once the store is closed."""
        self._check_open()
        return operation(self._layout, *args)

    def _reading(self, state_id: str) -> Steps[Record | None]:
        """The steps of ``read``: with ``auto_pack``, a pack of what was read may follow."""
        if self.auto_pack is None:
            return self._steps(read, self._ledger, state_id)
        return self._steps(read_and_pack, self._ledger, state_id, self.auto_pack)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(
                f"{self!r} is closed: make a new S3Store (a store kept for the whole process "
                "needs no close; an async client closes with its event loop)"
            )

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
        await self._async.run(self._steps(write, self._ledger, state_id, entries, snapshot, create))

    async def aread(self, state_id: str) -> Record | None:
        """Async ``read``, on aioboto3."""
        return await self._async.run(self._reading(state_id))

    async def alist(self) -> builtins.list[Summary]:
        """Async ``list``, on aioboto3."""
        return await self._async.run(self._steps(list_states))

    async def adelete(self, state_id: str) -> None:
        """Async ``delete``, on aioboto3."""
        await self._async.run(self._steps(delete, self._ledger, state_id))

    async def aobjects(self, state_id: str) -> builtins.list[StoredObject]:
        """Async ``objects``, on aioboto3."""
        return await self._async.run(self._steps(objects, state_id))

    async def apack(self, state_id: str, *, remove_entries: bool = False) -> Packed:
        """Async ``pack``, on aioboto3."""
        return await self._async.run(self._steps(pack, state_id, remove_entries, self._ledger))

    async def asweep(self, older_than: float = SWEEP_AGE) -> builtins.list[str]:
        """Async ``sweep``, on aioboto3."""
        return await self._async.run(self._steps(sweep, older_than))

    async def aclose(self) -> None:
        """Close the aioboto3 client of the running event loop, and the sync client.

        The store refuses any later use.
        """
        self._closed = True
        await self._async.aclose()
        self._sync.close()

    # Context managers (the published Store base has none) ------------------------------

    def __enter__(self) -> Self:
        self._check_open()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        self._check_open()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _pool_of(client: Any) -> int:
    """The connection pool of a client given to the store (botocore's default: 10)."""
    config = getattr(getattr(client, "meta", None), "config", None)
    return int(getattr(config, "max_pool_connections", None) or 10)
