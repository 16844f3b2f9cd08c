"""TLS of the store's clients: each CA bundle loaded once, not once per client or connection.

Loading botocore's 230 KB CA bundle into an SSL context costs about 40 ms of CPU here, more
than a load of a packed 1,000-entry State (bench/table.py). The clients as botocore and
aiobotocore make them load it far more often than once:

* **sync** (botocore on urllib3): every new connection loads the bundle into the client's
  context again, so the first load of a State, whose GETs open up to ``max_concurrency``
  connections at once, loaded it 16 times (``max_concurrency`` was 16): about 0.6 s of CPU
  on a cold start (and once per request on a server that closes every connection, as moto's
  does). ``share_sync_tls`` loads
  it into the client's context once (again when the file changes) and tells urllib3 it is
  there;
* **async** (aiobotocore on aiohttp): every client makes a new context and loads the bundle,
  and an S3Store opens a client in every event loop, so a serverless handler that runs
  ``asyncio.run`` per event (docs/serverless.md) paid it at every event.
  ``SharedContextSession`` loads each bundle once per process (again when the file changes)
  into a context made as aiobotocore makes it, for every client.

Either applies only to the default TLS set-up: verification on with a CA bundle file, no
proxy, no client certificate; for anything else the clients are as botocore and aiobotocore
make them. The async clients' shared context also checks host names, as the sync clients
do (aiobotocore's own context left that undone: aiohttp checks them only when the context
asks). An ``ssl.SSLContext`` may be shared by connections of any thread or event loop; a
bundle is loaded under a lock of its own, before any connection uses what was loaded.
"""

from __future__ import annotations

import functools
import os
import ssl
import threading
import weakref
from typing import Any

from botocore.httpsession import URLLib3Session, get_cert_path

# A version of a CA bundle file: its path, and what a rewrite of the file changes whatever its
# size and mtime (``os.utime`` can put an mtime back, not a ctime).
Version = tuple[str, int, int, int, int, int]


class _State:
    """What this module holds, and its locks.

    The locks are made anew in a forked child: one another thread held at the fork would
    never be released there.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held briefly: to look up and to store
        self.loading: dict[object, threading.Lock] = {}  # one per bundle or context loading
        # The newest version of each CA bundle -> the context with it loaded (async clients).
        self.contexts: dict[Version, ssl.SSLContext] = {}
        # A sync client's context -> the version of the bundle last loaded into it.
        self.loaded: weakref.WeakKeyDictionary[ssl.SSLContext, Version] = (
            weakref.WeakKeyDictionary()
        )

    def loading_lock(self, key: object) -> threading.Lock:
        """The lock of one load (of a bundle version, or into one context)."""
        with self.lock:
            return self.loading.setdefault(key, threading.Lock())

    def after_fork(self) -> None:
        self.lock = threading.Lock()
        self.loading = {}


_state = _State()
if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_state.after_fork)


def forget() -> None:
    """Drop the contexts the async clients share (for tests: the next client loads again)."""
    with _state.lock:
        _state.contexts.clear()


def _default_bundle(verify: Any) -> str | None:
    """The CA bundle file of a default TLS set-up (``verify`` on), else ``None``."""
    if not verify:
        return None
    bundle = get_cert_path(verify)
    if not isinstance(bundle, str) or not os.path.isfile(bundle):
        return None  # a directory, or a file that is missing: as botocore does it
    return bundle


# Sync -------------------------------------------------------------------------------------


def share_sync_tls(client: Any) -> None:
    """Make a boto3 client load its CA bundle once, not at every new connection.

    botocore sets the pool's ``ca_certs`` before each request, and urllib3 loads it into the
    client's one SSL context at each connection it opens. Here the bundle is loaded into that
    context at the first request to an ``https://`` endpoint, and the pool is given no
    ``ca_certs``: urllib3 then verifies with the context as it is (it loads nothing into a
    context it was given). A client whose http session is not botocore's own is left as is.
    """
    http = getattr(getattr(client, "_endpoint", None), "http_session", None)
    if type(http) is not URLLib3Session or not callable(getattr(http, "_setup_ssl_cert", None)):
        return
    original = http._setup_ssl_cert  # type: ignore[attr-defined]  # botocore's, untyped
    http._setup_ssl_cert = functools.partial(_setup_ssl_cert, original, http)  # type: ignore[attr-defined]


def _setup_ssl_cert(
    original: Any, http: Any, conn: Any, url: Any, verify: Any, *rest: Any, **kw: Any
) -> None:
    """``URLLib3Session._setup_ssl_cert``, with the bundle loaded once into the context.

    For an ``https://`` URL, botocore's sets ``cert_reqs`` to ``CERT_REQUIRED`` and
    ``ca_certs`` to the bundle; this sets the same ``cert_reqs`` and no ``ca_certs``, once the
    bundle is in the context the pool's connections use. Any other case is botocore's: a
    request through a proxy, or to a pool with a client certificate.
    """
    context = getattr(conn, "conn_kw", {}).get("ssl_context")
    bundle = _default_bundle(verify)
    proxies = getattr(http, "_proxy_config", None)
    if (
        rest
        or kw
        or not str(url).lower().startswith("https")
        or proxies is None
        or proxies.proxy_url_for(url)
        or not isinstance(context, ssl.SSLContext)
        or bundle is None
        or getattr(conn, "cert_file", None)
    ):
        original(conn, url, verify, *rest, **kw)
        return
    version = _version(bundle)
    if _state.loaded.get(context) != version:  # not yet, or the file was replaced since
        with _state.loading_lock(id(context)):  # one load, while other requests wait for it
            if _state.loaded.get(context) != version:
                context.load_verify_locations(bundle, None, None)
                _state.loaded[context] = version
        with _state.lock:  # done: a request that comes later finds it loaded
            _state.loading.pop(id(context), None)
    conn.cert_reqs = "CERT_REQUIRED"
    conn.ca_certs = None  # in the context already: urllib3 loads nothing more


# Async ------------------------------------------------------------------------------------


@functools.cache
def shared_context_session() -> type:
    """A subclass of aiobotocore's ``AIOHTTPSession`` sharing one context per CA bundle."""
    import aiohttp
    from aiobotocore.httpsession import AIOHTTPSession

    base: Any = AIOHTTPSession  # its private methods are not in the type stubs

    class SharedContextSession(base):  # type: ignore[misc]
        """aiobotocore's aiohttp session, whose default TLS context is shared (``_tls``)."""

        def _create_connector(self, proxy_url: Any = None, *rest: Any, **kw: Any) -> Any:
            bundle = _default_bundle(getattr(self, "_verify", None))
            if (
                rest
                or kw
                or proxy_url
                or bundle is None
                or getattr(self, "_cert_file", None)
                or not hasattr(self, "_max_pool_connections")
                or not isinstance(getattr(self, "_connector_args", None), dict)
            ):
                return super()._create_connector(proxy_url, *rest, **kw)
            # aiobotocore's own connector, with the context shared.
            return aiohttp.TCPConnector(
                limit=self._max_pool_connections,
                ssl=_shared_context(bundle, self._get_ssl_context),
                **self._connector_args,
            )

    return SharedContextSession


def _shared_context(bundle: str, make: Any) -> ssl.SSLContext:
    """The context with ``bundle`` loaded, as the file is now; made by ``make()`` at first.

    It checks host names, as botocore's sync clients do (aiohttp checks them only when the
    context asks it to, and aiobotocore's context does not).
    """
    version = _version(bundle)
    context = _state.contexts.get(version)
    if context is not None:
        return context
    with _state.loading_lock(version):  # one load of each version, not one per event loop
        context = _state.contexts.get(version)
        if context is None:
            context = make()
            context.verify_mode = ssl.CERT_REQUIRED
            context.check_hostname = True
            context.load_verify_locations(bundle, None, None)
            with _state.lock:
                # The newest version of each bundle is kept, not every version it had.
                for old in [v for v in _state.contexts if v[0] == bundle]:
                    del _state.contexts[old]
                    _state.loading.pop(old, None)
                _state.contexts[version] = context
    return context


def _version(bundle: str) -> Version:
    """A CA bundle file as it is now: a file replaced (rotated) since is another version."""
    found = os.stat(bundle)
    return (
        bundle,
        found.st_dev,
        found.st_ino,
        found.st_size,
        found.st_mtime_ns,
        found.st_ctime_ns,
    )


def session_class(config: Any) -> Any:
    """The http session class for an async client of ``config``.

    ``config`` is a botocore or aiobotocore Config, or ``None``. The class an ``AioConfig``
    names is kept unless it is aiobotocore's default; that one is given the shared context.
    """
    from aiobotocore.httpsession import AIOHTTPSession

    named = getattr(config, "http_session_cls", None)
    if named is None or named is AIOHTTPSession:
        return shared_context_session()
    return named
