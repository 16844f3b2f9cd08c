"""S3Store: States in an S3 bucket, on boto3 (sync) and aioboto3 (async).

Every operation is a generator of steps (``_save``, ``_load``, ``_list``, ``_delete``,
``_sweep``, ``_engine``); this class checks its arguments, knows its identity and hands the
steps to the sync or the async driver. Nothing here decides what is sent.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar
from urllib.parse import urlsplit

from botocore.config import Config

from alpineagents_s3._async import AsyncDriver
from alpineagents_s3._clients import Clients, endpoint_identity
from alpineagents_s3._contract import DELETE_OF_UNKNOWN_RAISES, Record, Store, Summary, make_record
from alpineagents_s3._delete import Deleted, delete
from alpineagents_s3._engine import Check, doctor
from alpineagents_s3._keys import Layout, root_of, sse_params
from alpineagents_s3._list import StoredObject, check_limit, list_states, objects
from alpineagents_s3._load import read
from alpineagents_s3._memory import MEMORY, Ctx, Memory
from alpineagents_s3._save import write
from alpineagents_s3._steps import Steps
from alpineagents_s3._sweep import SWEEP_AGE, check_age, sweep
from alpineagents_s3._sync import SyncDriver
from alpineagents_s3._translate import scrub
from alpineagents_s3.errors import StateNotFoundError, StoreClosedError

if TYPE_CHECKING:
    import aioboto3
    import boto3
    from types_boto3_s3 import S3Client

__all__ = ["S3Store"]

# How the core names an entry it cannot rebuild ("the history entry read at position 3").
_POSITION: Final = re.compile(r"entry read at position (\d+)")

EventHook = Callable[..., Any]
T = TypeVar("T")


class S3Store(Store):
    """Keeps States in an S3 bucket: ``s3://bucket/prefix/heads/<id>.json`` and its parts.

    Each State has one *head* object, its only commit point: the snapshot and the list of the
    objects that hold its history. Each history entry is written once as an object of its
    own, keyed by its seq, and never replaced; every 16 entries the saves pack them into
    larger *segments*, so a State stays a few objects at any length and loads in two round
    trips. A save is one PUT per new entry and one of the head, conditional on the head this
    process last read or wrote, so a second process running the same State gets
    ``ConcurrentWriteError`` instead of overwriting it. The protocol is docs/protocol.md.

    The sync methods use boto3, the async ones aioboto3 (a client opened in the running event
    loop, closed by ``aclose()`` or ``async with store``). Credentials, region, profile and
    endpoint come from the usual boto configuration unless given here.

    Args:
        bucket: The bucket; it must exist.
        prefix: A folder in the bucket for the States (``"runs"``: under ``runs/``).
        endpoint_url: An S3-compatible endpoint (LocalStack, moto, MinIO, ...). Default: the
            configured one (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the profile), else AWS.
        region_name: Default: the configured region.
        client: A boto3 S3 client for the sync methods (not closed by the store).
        session: A ``boto3.Session`` to make the sync client with (a profile, credentials).
        aio_session: An ``aioboto3.Session`` for the async clients. Default: one with the
            profile and region of ``session``, if given.
        config: A ``botocore.config.Config`` merged over the defaults: botocore's ``standard``
            retry mode with 5 attempts (unless ``AWS_RETRY_MODE``, ``AWS_MAX_ATTEMPTS`` or the
            profile say otherwise) and a connection pool as large as ``max_concurrency``.
            An aiobotocore ``AioConfig`` also gives the async clients its ``connector_args``.
        max_concurrency: Requests at once within one operation (the parts of a load, the heads
            of a list); never more than the client's connection pool.
        server_side_encryption: ``"AES256"`` (SSE-S3), ``"aws:kms"`` or ``"aws:kms:dsse"``,
            sent with every PUT.
        sse_kms_key_id: The KMS key for SSE-KMS, sent with every PUT (implies ``"aws:kms"``).
        event_hooks: botocore event handlers registered on every client the store opens.
        trust_conditional_writes: Skip the check that the endpoint refuses a second create and
            a stale ``If-Match`` (made once per process and bucket, before the first save).
            Only for an endpoint you know honours them: behind one that ignores them, a
            second writer's save would overwrite the State.
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
        trust_conditional_writes: bool = False,
    ):
        if not isinstance(bucket, str) or not bucket or "/" in bucket:
            raise ValueError(f"invalid bucket name {bucket!r}")
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
            raise TypeError(f"max_concurrency is a whole number, not {max_concurrency!r}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency}")
        sse = sse_params(server_side_encryption, sse_kms_key_id)
        self.bucket = bucket
        self.prefix = root_of(prefix)
        self.endpoint_url = endpoint_url
        self.region_name = region_name
        self.max_concurrency = max_concurrency
        self.trust_conditional_writes = bool(trust_conditional_writes)
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
        self._closed = False
        self._memory: Memory = MEMORY
        endpoint = endpoint_url or (client.meta.endpoint_url if client else "the S3 endpoint")
        self._layout = Layout(bucket=bucket, root=self.prefix, endpoint=scrub(endpoint), sse=sse)
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
            raise ValueError(f"not an S3Store URL: {scrub(url)!r} (expected s3://bucket/prefix)")
        return cls(parts.netloc, parts.path, **options)

    @classmethod
    def demo_support(cls) -> Any:
        """What ``python -m alpineagents.demo --store s3`` uses (``alpineagents_s3.demo``)."""
        from alpineagents_s3 import demo

        return demo

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
            endpoint = self._clients.configured_endpoint(self._given_client)
            self._identity = (scrub(endpoint_identity(endpoint)), self.bucket, self.prefix)
        return self._identity

    # Clients ---------------------------------------------------------------------------

    @property
    def client(self) -> S3Client:
        """The boto3 S3 client of the sync methods, made at first use."""
        self._check_open()
        client: S3Client = self._sync.client
        return client

    def _opened(self, client: Any) -> None:
        """A client was opened: messages name its endpoint (without credentials)."""
        self._layout = replace(self._layout, endpoint=scrub(str(client.meta.endpoint_url)))

    def _ctx(self) -> Ctx:
        self._check_open()
        return Ctx(self._layout, self._memory, self._key(), self.trust_conditional_writes)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(
                f"{self!r} is closed: make a new S3Store (a store kept for the whole process "
                "needs no close; an async client closes with its event loop)"
            )

    def _run(self, steps: Callable[[Ctx], Steps[T]]) -> T:
        return self._sync.run(steps(self._ctx()))

    async def _arun(self, steps: Callable[[Ctx], Steps[T]]) -> T:
        return await self._async.run(steps(self._ctx()))

    # The Store contract, sync ----------------------------------------------------------

    def write(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        """Save: PUT the entries the bucket lacks, in parallel, then the head (the commit).

        ``snapshot`` is the core's snapshot (alpineagents 0.2-0.4; ``None`` keeps the stored
        one) or its info dict (0.5+); the store does not look inside it. Raises
        ``StateExistsError`` (a ``ValueError``) for a create of a taken id,
        ``StateNotFoundError`` (a ``KeyError``) for a State deleted or never created, and
        ``ConcurrentWriteError`` when another process saved the State since this one last
        read or wrote it.
        """
        self._run(lambda ctx: write(ctx, state_id, entries, snapshot, create))

    def read(self, state_id: str) -> Record | None:
        """The State's entries and snapshot (two round trips; one if unchanged since last read)."""
        found = self._run(lambda ctx: read(ctx, state_id))
        return None if found is None else make_record(*found)

    def load(self, state_id: str) -> Any:
        """The core's ``load``; an error of the core about what is stored names where it is."""
        try:
            return super().load(state_id)
        except Exception as e:
            self._note_where(e, state_id)
            raise

    def list(self, *, limit: int | None = None) -> builtins.list[Summary]:
        """The saved States, most recently updated first; ``limit``: only the newest so many.

        Each is the installed alpineagents' own summary: ``SavedState`` (0.2-0.4 and this
        repository's core) or ``StateInfo`` (0.5+). One LIST per 1,000 States, then one GET per
        State (per State returned, with ``limit``). Raises ``IncompleteListError`` when a State
        could not be read; it holds the others.
        """
        limit = check_limit(limit)
        return self._run(lambda ctx: list_states(ctx, limit))

    # The contract's delete returns nothing; this one says what it removed.
    def delete(self, state_id: str, *, purge: bool = False) -> Deleted | None:  # type: ignore[override]
        """Delete a State: its head first, then its objects; what it removed.

        ``purge=True`` also removes every older version and delete marker of them on a
        versioned bucket (erasure: docs/erasure.md). ``KeyError`` for an unknown id with this
        repository's core; nothing with a published core (its contract says so).
        """
        deleted = self._run(lambda ctx: delete(ctx, state_id, purge))
        return self._deleted(state_id, deleted)

    def sweep(
        self, older_than: float = SWEEP_AGE, *, at_bucket_root: bool = False
    ) -> builtins.list[str]:
        """Remove what saves that died or lost a race left; return the keys removed.

        Objects that no head names, older than ``older_than`` seconds (default one day) and
        marked as the store's. A store at the bucket's root (empty prefix) sweeps only with
        ``at_bucket_root=True``. Run it from a scheduled job; saves never need it.
        """
        check_age(older_than)
        return self._run(lambda ctx: sweep(ctx, older_than, at_bucket_root))

    def objects(self, state_id: str) -> builtins.list[StoredObject]:
        """Every object under the State's head and folder, with its size and role, by key."""
        return self._run(lambda ctx: objects(ctx, state_id))

    def doctor(self) -> builtins.list[Check]:
        """Check the bucket: reachable, conditional writes honoured, versioning.

        ``alpineagents doctor s3://bucket/prefix`` prints these checks.
        """
        return self._run(doctor)

    def close(self) -> None:
        """Close the boto3 client and thread pool; the store refuses any later use."""
        self._closed = True
        self._sync.close()
        self._async.forget_ended_loops()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` or ``aclose()`` was called."""
        return self._closed

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
        await self._arun(lambda ctx: write(ctx, state_id, entries, snapshot, create))

    async def aread(self, state_id: str) -> Record | None:
        """Async ``read``, on aioboto3."""
        found = await self._arun(lambda ctx: read(ctx, state_id))
        return None if found is None else make_record(*found)

    async def aload(self, state_id: str) -> Any:
        """Async ``load``."""
        try:
            return await super().aload(state_id)
        except Exception as e:
            self._note_where(e, state_id)
            raise

    async def alist(self, *, limit: int | None = None) -> builtins.list[Summary]:
        """Async ``list``, on aioboto3."""
        limit = check_limit(limit)
        return await self._arun(lambda ctx: list_states(ctx, limit))

    async def adelete(  # type: ignore[override]  # as delete
        self, state_id: str, *, purge: bool = False
    ) -> Deleted | None:
        """Async ``delete``, on aioboto3."""
        deleted = await self._arun(lambda ctx: delete(ctx, state_id, purge))
        return self._deleted(state_id, deleted)

    async def asweep(
        self, older_than: float = SWEEP_AGE, *, at_bucket_root: bool = False
    ) -> builtins.list[str]:
        """Async ``sweep``, on aioboto3."""
        check_age(older_than)
        return await self._arun(lambda ctx: sweep(ctx, older_than, at_bucket_root))

    async def aobjects(self, state_id: str) -> builtins.list[StoredObject]:
        """Async ``objects``, on aioboto3."""
        return await self._arun(lambda ctx: objects(ctx, state_id))

    async def adoctor(self) -> builtins.list[Check]:
        """Async ``doctor``, on aioboto3."""
        return await self._arun(doctor)

    async def aclose(self) -> None:
        """Close the aioboto3 client of the running event loop, and the sync client."""
        self._closed = True
        await self._async.aclose()
        self._sync.close()

    # Helpers ---------------------------------------------------------------------------

    def _deleted(self, state_id: str, deleted: Deleted | None) -> Deleted | None:
        if deleted is None and DELETE_OF_UNKNOWN_RAISES:
            raise StateNotFoundError(f"no saved State with id {state_id!r} in {self!r}")
        return deleted

    def _note_where(self, error: Exception, state_id: str) -> None:
        """Name the State's head, and the object of an entry named, on an error about them."""
        if isinstance(error, LookupError):
            return
        layout, text = self._layout, str(error)
        head = layout.url(layout.head_key(state_id))
        if head not in text:
            error.add_note(f"State {state_id!r} is stored at {head}")
        found = _POSITION.search(text)
        known = self._memory.seen(self._key(), state_id).head
        if found and known is not None:
            for part in known.covering(int(found.group(1)), int(found.group(1))):
                error.add_note(
                    f"history entry {found.group(1)} is in "
                    f"{layout.url(part.key(layout, state_id, known.inc))}"
                )

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
