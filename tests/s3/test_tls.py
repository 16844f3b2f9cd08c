"""The clients' CA bundle, loaded once (alpineagents_s3/_tls.py), over real TLS.

moto's server is put behind a TLS proxy on 127.0.0.1 whose certificate a CA made here signs;
moto closes every connection after its answer, so each request is a new TLS connection. An
S3Store on ``https://`` must verify the server with the CA bundle botocore is configured with
(``AWS_CA_BUNDLE``), load that bundle once: a sync client once for all its connections, the
async clients once per process however many event loops open them, and again once the file
changed. It must refuse a server its bundle does not vouch for, and keep what an
``AioConfig`` of the user's own asks for.
"""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from aiobotocore.config import AioConfig
from aiobotocore.httpsession import AIOHTTPSession

from alpineagents_s3 import S3Store, S3StoreError, _tls
from tests.helpers import Mode, entry_dicts, snapshot_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
try:
    from tls_proxy import TLSProxy, make_ca_and_server
finally:
    sys.path.pop(0)

REFUSED = r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"


@pytest.fixture(scope="module")
def tls(
    moto_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TLSProxy, Path, Path]]:
    """The proxy, the bundle of the CA that signed its certificate, and another CA's bundle."""
    folder = tmp_path_factory.mktemp("tls")
    bundle, cert, key = make_ca_and_server(folder, "a")
    other, _, _ = make_ca_and_server(folder, "b")
    with TLSProxy(moto_url, cert, key) as proxy:
        yield proxy, bundle, other


@pytest.fixture
def trusted(
    tls: tuple[TLSProxy, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> tuple[TLSProxy, Path]:
    """The proxy and the bundle of its CA, which ``AWS_CA_BUNDLE`` names for the test."""
    proxy, bundle, _ = tls
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    return proxy, bundle


@pytest.fixture(autouse=True)
def no_shared_contexts() -> Iterator[None]:
    """Each test starts with no context shared yet, whatever ran before it in the process."""
    _tls.forget()
    yield
    _tls.forget()


@pytest.fixture
def bucket(moto_url: str) -> str:
    name = f"tls-{uuid.uuid4().hex[:20]}"  # (an id() may be the last test's again)
    boto3.client("s3", endpoint_url=moto_url).create_bucket(Bucket=name)
    return name


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The CA files loaded into SSL contexts from here on, in this process."""
    seen: list[str] = []
    original = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, cafile: Any = None, *args: Any, **kwargs: Any) -> None:
        seen.append(str(cafile))
        original(self, cafile, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    return seen


def save_and_read(store: S3Store, mode: Mode, state_id: str, entries: int = 2) -> Any:
    """Create a State of ``entries`` entries and read it back; async in an event loop of its own."""
    first = (entry_dicts(0, entries, state_id), snapshot_dict(state_id, entries))
    if mode == "sync":
        store.write(state_id, *first, create=True)
        return store.read(state_id)

    async def go() -> Any:
        await store.awrite(state_id, *first, create=True)
        return await store.aread(state_id)

    return asyncio.run(go())


def test_a_sync_client_loads_the_bundle_once_for_all_its_connections(
    trusted: tuple[TLSProxy, Path],
    bucket: str,
    loads: list[str],
) -> None:
    proxy, bundle = trusted
    before = proxy.handshakes
    store = S3Store(bucket, endpoint_url=proxy.url)
    # 40 entry PUTs, the snapshot's, then a load: 16 at once, each on a connection of its own.
    record = save_and_read(store, "sync", "many", entries=40)
    assert record is not None and len(record.entries) == 40
    assert proxy.handshakes - before >= 80  # every request went through a TLS handshake
    assert loads.count(str(bundle)) == 1, loads
    store.close()


def test_clients_of_new_event_loops_verify_with_one_load_of_the_bundle(
    trusted: tuple[TLSProxy, Path],
    bucket: str,
    loads: list[str],
) -> None:
    proxy, bundle = trusted
    before = proxy.handshakes
    # One store used in three event loops (a serverless handler's asyncio.run per event),
    # and a second store: four async clients, one load of the bundle.
    store = S3Store(bucket, endpoint_url=proxy.url)
    for n in range(3):
        record = save_and_read(store, "async", f"loop-{n}")
        assert record is not None and len(record.entries) == 2
    other = S3Store(bucket, "other", endpoint_url=proxy.url)
    assert save_and_read(other, "async", "second-store") is not None
    assert loads.count(str(bundle)) == 1, loads
    assert proxy.handshakes - before >= 4 * 4  # 2 entries, the snapshot, the read's GETs
    store.close()
    other.close()


def test_a_bundle_that_does_not_vouch_for_the_server_is_refused(
    mode: Mode, tls: tuple[TLSProxy, Path, Path], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, bundle, other = tls
    monkeypatch.setenv("AWS_CA_BUNDLE", str(other))
    once = AioConfig(retries={"max_attempts": 1})
    refused = S3Store(bucket, endpoint_url=proxy.url, config=once)
    with pytest.raises(S3StoreError, match=REFUSED):
        save_and_read(refused, mode, "refused")
    with pytest.raises(S3StoreError, match=REFUSED):  # and again: nothing was let through
        save_and_read(refused, mode, "refused-again")
    refused.close()
    # The bundle that vouches for it, in the same process: accepted.
    monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    accepted = S3Store(bucket, endpoint_url=proxy.url)
    assert save_and_read(accepted, mode, "accepted") is not None
    accepted.close()


def replace_keeping_size_and_mtime(path: Path, content: bytes) -> None:
    """Rewrite ``path`` as ``cp -p`` or an image with fixed mtimes would: same size, old mtime.

    ``content`` is padded with line ends to the file's size (PEM readers skip them).
    """
    before = path.stat()
    assert len(content) <= before.st_size
    path.write_bytes(content + b"\n" * (before.st_size - len(content)))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns


def test_a_bundle_replaced_on_disk_is_loaded_again(
    mode: Mode,
    tls: tuple[TLSProxy, Path, Path],
    bucket: str,
    loads: list[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A CA rotated in the bundle file: trusted from the next connection on (sync, the same
    client) or the next event loop (async), and the CA removed from it no longer trusted, even
    with the file's size and mtime as they were."""
    proxy, bundle, other = tls
    path = tmp_path / "bundle.pem"
    path.write_bytes(other.read_bytes() + b"\n" * 64)  # room for either CA: one size
    monkeypatch.setenv("AWS_CA_BUNDLE", str(path))
    once = AioConfig(retries={"max_attempts": 1})
    store = S3Store(bucket, endpoint_url=proxy.url, config=once)
    with pytest.raises(S3StoreError, match=REFUSED):
        save_and_read(store, mode, "before")
    # The operator puts the server's CA in the same file: the same store trusts it now.
    replace_keeping_size_and_mtime(path, bundle.read_bytes())
    assert save_and_read(store, mode, "after") is not None
    assert loads.count(str(path)) == 2, loads
    store.close()
    # And takes it out again: a new store (sync) or event loop (async) refuses the server.
    replace_keeping_size_and_mtime(path, other.read_bytes())
    again = S3Store(bucket, endpoint_url=proxy.url, config=once)
    with pytest.raises(S3StoreError, match=REFUSED):
        save_and_read(again, mode, "removed")
    again.close()


def test_a_certificate_for_another_host_name_is_refused(
    mode: Mode, trusted: tuple[TLSProxy, Path], bucket: str
) -> None:
    """The proxy's certificate names 127.0.0.1 alone: at ``localhost`` it is refused, by the
    async clients too (aiobotocore's own context did not check host names)."""
    proxy, _ = trusted
    url = proxy.url.replace("127.0.0.1", "localhost")
    store = S3Store(bucket, endpoint_url=url, config=AioConfig(retries={"max_attempts": 1}))
    with pytest.raises(S3StoreError, match=r"match|mismatch|not valid for"):
        save_and_read(store, mode, "elsewhere")
    store.close()


def test_a_process_forked_while_a_bundle_loads_is_not_stuck(
    trusted: tuple[TLSProxy, Path], bucket: str
) -> None:
    """A lock held by another thread at a fork (a load under way) is not the child's."""
    proxy, _ = trusted
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with _tls._state.loading_lock("a load under way"), _tls._state.lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(30)
    try:
        pid = os.fork()
        if pid == 0:  # the child: a sync and an async load, each loading the bundle
            code = 1
            try:
                signal.alarm(20)
                store = S3Store(bucket, endpoint_url=proxy.url)
                ok = save_and_read(store, "sync", "forked") is not None
                ok = ok and save_and_read(store, "async", "forked-async") is not None
                code = 0 if ok else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join(30)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_a_sync_pool_is_set_up_as_botocore_does_it_but_for_the_bundle(
    trusted: tuple[TLSProxy, Path],
) -> None:
    """A canary for a botocore that sets up its pools otherwise: what ``_setup_ssl_cert``
    sets on a pool is botocore's, but ``ca_certs``, whose bundle is in the context instead."""
    proxy, bundle = trusted
    pools = []
    for share in (False, True):
        client = boto3.client("s3", endpoint_url=proxy.url)
        if share:
            _tls.share_sync_tls(client)
        http: Any = client._endpoint.http_session  # type: ignore[attr-defined]  # botocore's own
        pool = http._manager.connection_from_url(f"{proxy.url}/bucket/key")
        http._setup_ssl_cert(pool, f"{proxy.url}/bucket/key", http._verify)
        pools.append(pool)
        client.close()
    simple = (str, int, float, bool, type(None))
    theirs, ours = ({k: v for k, v in vars(p).items() if isinstance(v, simple)} for p in pools)
    assert theirs.pop("ca_certs") == str(bundle) and ours.pop("ca_certs") is None
    assert ours == theirs
    loaded = pools[1].conn_kw["ssl_context"].get_ca_certs()
    assert [dict(c["subject"][0])["commonName"] for c in loaded] == ["alpineagents tests CA a"]


def test_through_a_proxy_the_clients_are_as_botocore_makes_them(
    trusted: tuple[TLSProxy, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, bundle = trusted
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    client = boto3.client("s3", endpoint_url=proxy.url)
    _tls.share_sync_tls(client)
    http: Any = client._endpoint.http_session  # type: ignore[attr-defined]  # botocore's own
    url = f"{proxy.url}/bucket/key"
    pool = http._get_connection_manager(url, "http://127.0.0.1:9").connection_from_url(url)
    http._setup_ssl_cert(pool, url, http._verify)
    assert pool.ca_certs == str(bundle)  # botocore's: urllib3 loads it
    client.close()

    async def contexts() -> list[Any]:
        session = _tls.shared_context_session()(verify=str(bundle))
        other = _tls.shared_context_session()(verify=str(bundle))
        made = [
            session._create_connector("http://127.0.0.1:9"),  # through a proxy
            session._create_connector(None),
            other._create_connector(None),
        ]
        for connector in made:
            await connector.close()
        return [connector._ssl for connector in made]

    proxied, shared, again = asyncio.run(contexts())
    assert shared is again  # two sessions, one context
    # Through a proxy without a proxy CA bundle, aiobotocore turns verification off
    # (``ssl=False``): its own choice, left as it is, not the shared context.
    assert proxied is False


def test_a_client_given_to_the_store_is_left_as_it_is(
    trusted: tuple[TLSProxy, Path], bucket: str
) -> None:
    proxy, _ = trusted
    client = boto3.client("s3", endpoint_url=proxy.url)
    http: Any = client._endpoint.http_session  # type: ignore[attr-defined]  # botocore's own
    setup = http._setup_ssl_cert
    store = S3Store(bucket, endpoint_url=proxy.url, client=client)
    assert save_and_read(store, "sync", "given") is not None
    assert http._setup_ssl_cert == setup
    store.close()
    client.close()


class OwnSession(AIOHTTPSession):
    """A user's http session class."""


def test_an_aioconfig_of_the_users_own_is_kept(moto_url: str, bucket: str) -> None:
    """Its ``http_session_cls`` and ``connector_args`` reach the async client (a merge of
    botocore Configs would drop both)."""
    config = AioConfig(
        connector_args={"keepalive_timeout": 3}, http_session_cls=OwnSession, read_timeout=7
    )
    own = S3Store(bucket, endpoint_url=moto_url, config=config)
    client = asyncio.run(_opened(own))
    http: Any = client._endpoint.http_session
    assert type(http) is OwnSession
    assert vars(http)["_connector_args"]["keepalive_timeout"] == 3
    assert client.meta.config.read_timeout == 7
    assert client.meta.config.retries["mode"] == "standard"  # the store's defaults stay
    # Without an AioConfig: the shared context's session, the store's defaults.
    plain = asyncio.run(_opened(S3Store(bucket, endpoint_url=moto_url)))
    assert type(plain._endpoint.http_session) is _tls.shared_context_session()
    assert plain.meta.config.retries["mode"] == "standard"


async def _opened(store: S3Store) -> Any:
    """The async client ``store`` opened in this event loop (closed when it returns)."""
    assert await store.aread("nothing") is None
    client = await store._async.client()
    await store.aclose()
    return client
