"""What a store given no ``session=`` costs to open: its sessions share the service models.

Each client of such a store comes from a new boto3 session (it reads the environment, profile
and credentials as they are then), but the JSON models those sessions load (the S3 model, its
endpoint rules, the partitions) are loaded once per process and search path. Loads are counted
where botocore reads a model file, in the threads of the test (moto's server loads its own).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.loaders import JSONFileLoader

from alpineagents_s3 import S3Store
from alpineagents_s3._clients import MODELS, botocore_session
from alpineagents_s3._memory import MEMORY
from tests.helpers import MakeBucket, entry_dicts, snapshot_dict

S3_MODEL = "s3/2006-03-01/service-2"


class Loads:
    """The model files botocore loaded, per thread, while the ``loads`` fixture runs."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str]] = []
        self._lock = threading.Lock()

    def note(self, path: str) -> None:
        with self._lock:
            self.seen.append((threading.get_ident(), path))

    def of(self, *threads: int) -> list[str]:
        """The files loaded by these threads (default: the calling one), in order."""
        wanted = set(threads) or {threading.get_ident()}
        with self._lock:
            return [path for thread, path in self.seen if thread in wanted]

    def clear(self) -> None:
        with self._lock:
            self.seen.clear()


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Loads]:
    """Counts model files loaded; the process's shared models are forgotten before and after."""
    seen = Loads()
    load_file = JSONFileLoader.load_file

    def counted(self: JSONFileLoader, file_path: str) -> Any:
        data = load_file(self, file_path)
        if data is not None:
            seen.note(file_path)
        return data

    monkeypatch.setattr(JSONFileLoader, "load_file", counted)
    MODELS.clear()
    try:
        yield seen
    finally:
        MODELS.clear()


def s3_models(paths: list[str]) -> int:
    """How many times the S3 service model was among ``paths``."""
    return sum(path.endswith(f"/{S3_MODEL}") for path in paths)


class Signed:
    """A ``before-send`` hook noting the access key and region each request was signed with."""

    def __init__(self) -> None:
        self.by: list[tuple[str, str]] = []

    def __call__(self, request: Any, **kwargs: Any) -> None:
        header = request.headers["Authorization"]
        header = header.decode() if isinstance(header, bytes) else header
        found = re.search(r"Credential=([^/]+)/\d+/([^/]+)/s3/", header)
        assert found is not None, header
        self.by.append((found[1], found[2]))

    @property
    def last(self) -> tuple[str, str]:
        return self.by[-1]


def test_a_second_store_loads_no_model_again(
    moto_url: str, moto_bucket: MakeBucket, loads: Loads
) -> None:
    bucket = moto_bucket()
    first = S3Store(bucket, endpoint_url=moto_url)
    assert first.read("nothing") is None
    assert s3_models(loads.of()) == 1  # a new process's first store loads the models
    loads.clear()
    clients = {id(first.client)}
    for _ in range(3):
        with S3Store(bucket, endpoint_url=moto_url) as store:
            assert store.read("nothing") is None
            clients.add(id(store.client))
    assert loads.of() == []
    assert len(clients) == 4  # each store still has a client of its own
    first.close()


def test_a_given_session_keeps_its_own_models(
    moto_url: str, moto_bucket: MakeBucket, loads: Loads
) -> None:
    bucket = moto_bucket()
    S3Store(bucket, endpoint_url=moto_url).read("nothing")  # the shared models are loaded
    session = boto3.Session()
    own = botocore_session(session).get_component("data_loader")
    loads.clear()
    with S3Store(bucket, endpoint_url=moto_url, session=session) as store:
        assert store.read("nothing") is None
    assert botocore_session(session).get_component("data_loader") is own
    assert s3_models(loads.of()) == 1  # loaded by the user's session, as before


def test_each_store_reads_the_environment_when_its_client_is_made(
    moto_url: str, moto_bucket: MakeBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = moto_bucket()
    signed = Signed()
    hooks = {"before-send.s3": signed}
    first = S3Store(bucket, endpoint_url=moto_url, event_hooks=hooks)
    first.read("nothing")
    assert signed.last == ("testing", "us-east-1")

    config = tmp_path / "config"
    config.write_text(
        "[profile other]\nregion = eu-west-3\n"
        "aws_access_key_id = other-key\naws_secret_access_key = other-secret\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "other")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name)  # they would win over the profile's
    second = S3Store(bucket, endpoint_url=moto_url, event_hooks=hooks)
    second.read("nothing")
    assert signed.last == ("other-key", "eu-west-3")
    first.read("nothing")  # a client made before keeps what it was made with
    assert signed.last == ("testing", "us-east-1")

    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    third = S3Store(bucket, endpoint_url=moto_url, event_hooks=hooks)
    third.read("nothing")
    assert signed.last == ("other-key", "ap-south-1")

    async def aread() -> None:
        async with S3Store(bucket, endpoint_url=moto_url, event_hooks=hooks) as store:
            await store.aread("nothing")

    monkeypatch.setenv("AWS_DEFAULT_REGION", "sa-east-1")
    asyncio.run(aread())
    assert signed.last == ("other-key", "sa-east-1")
    for store in (first, second, third):
        store.close()


def test_a_data_path_gets_models_of_its_own(
    moto_url: str,
    moto_bucket: MakeBucket,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    loads: Loads,
) -> None:
    bucket = moto_bucket()
    S3Store(bucket, endpoint_url=moto_url).read("nothing")
    loads.clear()
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    S3Store(bucket, endpoint_url=moto_url).read("nothing")
    assert s3_models(loads.of()) == 1  # another search path: loaded for it
    loads.clear()
    S3Store(bucket, endpoint_url=moto_url).read("nothing")
    monkeypatch.delenv("AWS_DATA_PATH")
    S3Store(bucket, endpoint_url=moto_url).read("nothing")
    assert loads.of() == []  # each search path's models were kept


def test_eight_threads_open_stores_at_once(
    moto_url: str, moto_bucket: MakeBucket, loads: Loads
) -> None:
    bucket = moto_bucket()
    start = threading.Barrier(8)
    errors: list[BaseException] = []
    read: dict[int, Any] = {}
    threads: list[threading.Thread] = []

    def run(n: int) -> None:
        try:
            start.wait()
            with S3Store(bucket, "runs", endpoint_url=moto_url) as store:
                store.write(f"s{n}", entry_dicts(0, 3), snapshot_dict(f"s{n}", 3), create=True)
                read[n] = store.read(f"s{n}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    for n in range(8):
        threads.append(threading.Thread(target=run, args=(n,)))
        threads[-1].start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert sorted(read) == list(range(8))
    for record in read.values():
        assert record is not None and list(record.entries) == entry_dicts(0, 3)
    # The first store's client is made under the lock: the others wait for its models.
    assert s3_models(loads.of(*(t.ident for t in threads if t.ident is not None))) == 1


async def test_eight_tasks_open_stores_at_once(
    moto_url: str, moto_bucket: MakeBucket, loads: Loads
) -> None:
    bucket = moto_bucket()

    async def run(n: int) -> Any:
        async with S3Store(bucket, "runs", endpoint_url=moto_url) as store:
            await store.awrite(f"a{n}", entry_dicts(0, 2), snapshot_dict(f"a{n}", 2), create=True)
            return await store.aread(f"a{n}")

    records = await asyncio.gather(*(run(n) for n in range(8)))
    for record in records:
        assert record is not None and list(record.entries) == entry_dicts(0, 2)
    async with S3Store(bucket, "runs", endpoint_url=moto_url) as store:
        loads.clear()
        assert await store.aread("a0") is not None
    assert loads.of() == []  # a later store, sync or async, loads nothing
    with S3Store(bucket, "runs", endpoint_url=moto_url) as store:
        assert store.read("a1") is not None
    assert loads.of() == []


@pytest.mark.parametrize("held", ["the shared models", "the bodies kept"])
def test_a_child_forked_while_the_lock_was_held_opens_stores(
    moto_url: str, moto_bucket: MakeBucket, held: str
) -> None:
    bucket = moto_bucket()
    lock = MODELS._lock if held == "the shared models" else MEMORY.bodies._guard
    with lock, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking with threads (3.12+)
        child = os.fork()
        if child == 0:  # the child: only this thread, and a lock nobody will release
            code = 1
            try:
                with S3Store(bucket, endpoint_url=moto_url) as store:
                    store.write(
                        "forked", entry_dicts(0, 1), snapshot_dict("forked", 1), create=True
                    )
                    record = store.read("forked")  # the bodies it wrote, held
                    code = 0 if record is not None and len(record.entries) == 1 else 1
            finally:
                os._exit(code)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(child, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    if done == (0, 0):
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("the forked child waited for the lock")
    assert os.waitstatus_to_exitcode(done[1]) == 0
