"""The timestamps of S3's responses, parsed by the store's own parser (``_timestamps``).

What could break, and is tried here: a value parsed to another instant than botocore's (a
millisecond lost, a zone applied twice, a look-alike form taken as S3's); a bad date accepted;
the parser reaching the other clients of the user's session, or a client given with
``client=``, through the session's shared parser factory; the store's own clients still
parsing with dateutil, in sync or async; a session whose factory leaves timestamps as text
(as the AWS CLI's does) breaking ``objects`` or ``sweep``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import aioboto3
import boto3
import botocore.parsers
import botocore.session
import pytest
from botocore.utils import parse_timestamp as botocore_parse
from hypothesis import given, settings
from hypothesis import strategies as st

from alpineagents import State
from alpineagents_s3 import S3Store
from alpineagents_s3._timestamps import as_datetime, parse_timestamp
from tests.helpers import Mode
from tests.s3.helpers import Stores, load, objects, raw_client, save
from tests.s3.test_sweep import abandoned

instants = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)


def iso(when: datetime, millis: bool) -> str:
    """``when`` as S3 writes it in XML (``%Y`` pads no year below 1000 on Linux)."""
    text = f"{when.year:04d}-{when:%m-%dT%H:%M:%S}"
    return f"{text}.{when.microsecond // 1000:03d}Z" if millis else f"{text}Z"


@settings(max_examples=300, deadline=None)
@given(instants)
def test_the_forms_s3_writes_parse_to_the_instant_botocore_parses(when: datetime) -> None:
    millis = when.replace(microsecond=when.microsecond // 1000 * 1000)
    whole = when.replace(microsecond=0)
    forms = {
        iso(millis, True): millis,
        iso(when, False): whole,
        format_datetime(whole, usegmt=True): whole,
    }
    for text, instant in forms.items():
        parsed = parse_timestamp(text)
        assert parsed == botocore_parse(text), text
        if when.year >= 1000 or not text.endswith("GMT"):
            # (dateutil reads a year below 1000 in an HTTP date around today's, as botocore does)
            assert parsed == instant, text
            assert parsed.utcoffset() == timedelta(0), text


@pytest.mark.parametrize("year", [0, 1, 69, 70, 75, 76, 99, 100, 999])
def test_an_http_date_of_a_year_before_1000_is_botocore_s(year: int) -> None:
    parses_as_botocore_does(f"Tue, 01 Dec {year:04d} 17:50:00 GMT")


def parses_as_botocore_does(text: str) -> None:
    """``text`` parses to botocore's instant, or is refused with botocore's error."""
    try:
        expected = botocore_parse(text)
    except ValueError:
        with pytest.raises(ValueError, match="Invalid timestamp"):
            parse_timestamp(text)
    else:
        assert parse_timestamp(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "2026-12-01T17:50:00.123456Z",  # microseconds
        "2026-12-01T17:50:00.000+01:00",  # an offset
        "2026-12-01T18:50:00.000+0100",
        "2026-12-01 17:50:00Z",  # a space for the T
        "2026-12-01T17:50:00.00Z",  # two digits of a fraction
        "20261201T175000Z",  # the basic form
        "Tue, 01 Dec 2026 17:50:00 +0000",  # an offset in an HTTP date
        "Tuesday, 01-Dec-26 17:50:00 GMT",  # RFC 850
        "1764611400",  # seconds since 1970
        "2026-１２-01T17:50:00.000Z",  # fullwidth digits  # noqa: RUF001
    ],
)
def test_other_forms_go_to_botocore(text: str) -> None:
    parses_as_botocore_does(text)


@pytest.mark.parametrize(
    "text",
    [
        "2026-04-31T17:50:00.000Z",
        "2026-02-29T00:00:00Z",
        "2026-12-01T24:00:00.000Z",
        "Thu, 31 Apr 2026 17:50:00 GMT",
        "Tue, 01 Xyz 2026 17:50:00 GMT",
        "Xyz, 01 Dec 2026 17:50:00 GMT",  # a weekday that is none
        "Dec, 01 Dec 2026 17:50:00 GMT",
    ],
)
def test_a_date_that_cannot_be_is_refused_as_botocore_refuses_it(text: str) -> None:
    with pytest.raises(ValueError, match="Invalid timestamp") as ours:
        parse_timestamp(text)
    with pytest.raises(ValueError, match="Invalid timestamp") as theirs:
        botocore_parse(text)
    assert str(ours.value) == str(theirs.value)


def test_as_datetime_takes_both() -> None:
    when = datetime(2026, 12, 1, 17, 50, tzinfo=UTC)
    assert as_datetime(when) is when
    assert as_datetime("2026-12-01T17:50:00.000Z") == when


@pytest.fixture
def dateutil_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every timestamp botocore's default parser parses from now on (its parsers look the
    default up when they are made, one per response)."""
    calls: list[Any] = []
    default = botocore.parsers.DEFAULT_TIMESTAMP_PARSER

    def counted(value: Any) -> datetime:
        calls.append(value)
        parsed: datetime = default(value)
        return parsed

    monkeypatch.setattr(botocore.parsers, "DEFAULT_TIMESTAMP_PARSER", counted)
    return calls


def saved_state(stores: Stores, state_id: str) -> State:
    state = State("timestamps", id=state_id)
    for n in range(3):
        state.add_user_message(f"message {n}")
    stores.new().save(state)
    return state


async def test_the_store_s_clients_parse_without_dateutil(
    mode: Mode, stores: Stores, dateutil_calls: list[Any]
) -> None:
    state = saved_state(stores, "fast")
    dateutil_calls.clear()
    store = stores.new()
    found = await objects(stores.io(mode), state.id)  # a listing: LastModified of each key
    assert (await load(store, mode, state.id)).history == state.history  # GETs: a header each
    assert dateutil_calls == []
    now = datetime.now(UTC)
    assert found and all(now - timedelta(minutes=5) < o.last_modified <= now for o in found)
    assert all(o.last_modified.utcoffset() == timedelta(0) for o in found)


async def test_other_clients_of_the_session_are_left_as_they_are(
    mode: Mode, stores: Stores, dateutil_calls: list[Any]
) -> None:
    session = boto3.Session()
    state = saved_state(stores, "shared")
    store = stores.new(session=session)
    await save(store, mode, state)  # the store's clients are made
    await load(store, mode, state.id)
    assert dateutil_calls == []
    # A client of the user's, of the same session, made after the store's: botocore's parser.
    own = session.client("s3", endpoint_url=stores.url)
    modified = own.head_object(Bucket=stores.bucket, Key=f"runs/{state.id}/snapshot.json")
    assert len(dateutil_calls) == 1
    assert modified["LastModified"] == parse_timestamp(dateutil_calls[0])
    # A client given with client=: the store uses it as it is.
    given = S3Store(stores.bucket, "runs", client=own)
    try:
        listed = await asyncio.to_thread(given.objects, state.id)
    finally:
        given.close()
    assert len(dateutil_calls) >= 1 + len(listed)  # a LastModified of each, at least


async def test_other_clients_of_a_given_aio_session_are_left_as_they_are(
    stores: Stores, dateutil_calls: list[Any]
) -> None:
    aio = aioboto3.Session()
    state = saved_state(stores, "shared-aio")
    store = stores.new(aio_session=aio)
    assert (await store.aload(state.id)).history == state.history
    assert dateutil_calls == []
    async with aio.client("s3", endpoint_url=stores.url) as own:
        await own.head_object(Bucket=stores.bucket, Key=f"runs/{state.id}/snapshot.json")
    assert len(dateutil_calls) == 1


@pytest.mark.parametrize("parser", [str, lambda text: text], ids=["str", "identity"])
async def test_a_session_that_keeps_timestamps_as_text_keeps_them_so(
    stores: Stores, parser: Callable[[str], str]
) -> None:
    """The AWS CLI's sessions parse no timestamp: ``objects`` and ``sweep`` read the text.

    Sync only: an aioboto3 session is made by the store or given, never from this one."""
    core = botocore.session.Session()
    core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parser)
    store = stores.new(session=boto3.Session(botocore_session=core), aio_session=None)
    state = saved_state(stores, "as-text")
    listed = await asyncio.to_thread(store.objects, state.id)
    assert listed and all(isinstance(o.last_modified, datetime) for o in listed)
    raw = store.client.list_objects_v2(Bucket=stores.bucket, Prefix="runs/")
    assert all(isinstance(item["LastModified"], str) for item in raw["Contents"])
    client = raw_client(stores.url)
    left = abandoned(client, stores.bucket, state.id, 2)  # a create that lost, then died
    assert sorted(await asyncio.to_thread(store.sweep, older_than=0)) == sorted(left)
    assert await asyncio.to_thread(store.sweep, older_than=0) == []
