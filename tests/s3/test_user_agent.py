"""The User-Agent header of the store's requests, built once per set of features (``_useragent``).

What could break, and is tried here: a header that differs from the one botocore would build
for that request (its features: a PUT with a checksum has one a GET has not, a paginator adds
one); the header of one set of features sent for another; the builder still run twice a
request; the change reaching the other clients of the user's session or a ``client=``; a second
call wrapping twice; a client built otherwise failing the store. Sync and async, on moto's
server.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.useragent import UserAgentString

from alpineagents import State
from alpineagents_s3 import S3Store
from alpineagents_s3._useragent import KEPT, cache_user_agent
from tests.helpers import Mode
from tests.s3.helpers import Stores, load, objects, save

BOTOCORE_BUILD = UserAgentString.to_string


def creator_of(client: Any) -> Any:
    """botocore's User-Agent builder of ``client`` (an attribute of its own)."""
    return client._user_agent_creator


class Builds:
    """botocore's builder, counted: which builders ran it, and how often."""

    def __init__(self) -> None:
        self.creators: list[Any] = []

    def __call__(self, creator: Any) -> str:
        self.creators.append(creator)
        header: str = BOTOCORE_BUILD(creator)
        return header


class Sent:
    """A ``before-send`` hook: each request's header, and the one botocore builds for it."""

    def __init__(self, builds: Builds) -> None:
        self.builds = builds
        self.headers: list[tuple[str, str, set[str]]] = []

    def __call__(self, request: Any, **kwargs: Any) -> None:
        header = request.headers["User-Agent"]
        header = header.decode() if isinstance(header, bytes) else header
        # In the request's context (its features), by every builder the store's clients have.
        expected = {as_set(BOTOCORE_BUILD(creator)) for creator in set(self.builds.creators)}
        self.headers.append((request.method, as_set(header), expected))


def as_set(header: str) -> str:
    """``header`` with the features of its ``m/`` part in order: botocore writes them in the
    order of a Python set, which two requests with the same features may not share."""
    return " ".join(
        "m/" + ",".join(sorted(part[2:].split(","))) if part.startswith("m/") else part
        for part in header.split(" ")
    )


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Builds:
    counted = Builds()

    def to_string(creator: Any) -> str:
        return counted(creator)

    monkeypatch.setattr(UserAgentString, "to_string", to_string)
    return counted


async def test_each_request_sends_the_header_botocore_builds_for_it(
    mode: Mode, stores: Stores, builds: Builds
) -> None:
    sent = Sent(builds)
    store = stores.new(event_hooks={"before-send": sent})
    state = State("twenty", id=f"agent-{mode}")
    for n in range(10):
        state.add_user_message(f"message {n}")
    await save(store, mode, state)
    for _ in range(3):
        assert (await load(store, mode, state.id)).history == state.history
    await objects(stores.io(mode), state.id)

    requests = [(method, header) for method, header, _ in sent.headers]
    assert len(requests) >= 20
    for method, header, expected in sent.headers:
        assert header in expected, (method, header, expected)
    # A PUT (a checksum) and a GET register different features, and each has its own header.
    assert {h for m, h in requests if m == "PUT"}.isdisjoint({h for m, h in requests if m == "GET"})
    # botocore builds one for each set of features (and one as the client is made), not two
    # for every request.
    assert len(builds.creators) <= 8, len(builds.creators)


def test_a_paginator_of_the_store_client_gets_its_feature(stores: Stores, builds: Builds) -> None:
    store = stores.new()
    store.client.list_objects_v2(Bucket=stores.bucket, Prefix="runs/")
    paginator = store.client.get_paginator("list_objects_v2")
    sent = Sent(builds)
    store.client.meta.events.register("before-send", sent)
    list(paginator.paginate(Bucket=stores.bucket, Prefix="runs/"))
    store.client.list_objects_v2(Bucket=stores.bucket, Prefix="runs/")
    (_, paged, expected_paged), (_, plain, expected_plain) = sent.headers
    assert paged in expected_paged and plain in expected_plain
    assert paged != plain  # the paginator's feature is in one, not in the other


def test_other_clients_of_the_session_and_a_given_client_are_left_as_they_are(
    stores: Stores,
) -> None:
    session = boto3.Session()
    store = stores.new(session=session)
    store.client.list_objects_v2(Bucket=stores.bucket, Prefix="runs/")
    assert "to_string" in vars(creator_of(store.client))
    own = session.client("s3", endpoint_url=stores.url)
    given = S3Store(stores.bucket, "runs", client=own)
    try:
        given.get("nothing-here")
    finally:
        given.close()
    assert "to_string" not in vars(creator_of(own))
    assert "to_string" not in vars(creator_of(session.client("s3")))


def test_a_second_call_does_not_wrap_twice(stores: Stores) -> None:
    client = stores.new().client
    cached = creator_of(client).to_string
    cache_user_agent(client)
    assert creator_of(client).to_string is cached


@pytest.mark.parametrize("client", [object(), type("Bare", (), {"_user_agent_creator": None})()])
def test_a_client_built_otherwise_is_left_as_it_is(client: Any) -> None:
    cache_user_agent(client)  # no error, nothing set


def test_the_kept_headers_stay_few(stores: Stores, builds: Builds) -> None:
    """Each new set of features builds once; past ``KEPT`` sets the kept ones are dropped."""
    client = boto3.Session().client("s3", endpoint_url=stores.url)
    cache_user_agent(client)
    creator = creator_of(client)
    headers = set()
    for n in range(KEPT + 5):
        creator._client_features = {f"feature-{n}"}
        headers.add(creator.to_string())
        assert creator.to_string() in headers
    assert len(headers) == KEPT + 5

    def built() -> int:
        return sum(1 for c in builds.creators if c is creator)

    assert built() == KEPT + 5  # each once: the second call of each was kept
    creator._client_features = {"feature-0"}  # dropped when the kept ones reached KEPT
    creator.to_string()
    assert built() == KEPT + 6
