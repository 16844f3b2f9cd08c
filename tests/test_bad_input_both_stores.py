"""Bad input on both stores, property by property (hypothesis): ids, data, tool input and
results, and damaged objects.

Each property holds for FileStore (a temporary folder) and for S3Store on moto's in-process
``mock_aws`` (no server, so these stay in the fast tier); test_bad_input_properties.py checks
more on FileStore alone:

* a valid id round-trips; an invalid one is refused with a ``ValueError`` that names it;
* a value in ``state.data`` is either saved and loaded back equal, or refused up front by
  ``NotJSONError`` naming the path ``state.data[...]``, writing nothing; and refusing it
  never leaves a State that cannot be saved or loaded;
* tool input and tool results of any JSON-ish value: the run finishes, the tool runs exactly
  when its input can be saved (inside the model's response entry, 3 levels down), and the
  State loads back as it ran;
* a stored object with bytes flipped or cut off is either still read, or refused by ``load``
  with a ``StoreError`` (``CorruptStateError``, ``SchemaVersionError``), never another
  exception.

Whether a value can be saved is decided here by an oracle written from the user guide's
rules (finite floats, text without lone surrogates, string keys, at most ``MAX_DEPTH``
levels, ints Python reads back), and compared with what the library does.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alpineagents import Agent, FileStore, ModelRequest, State, Store
from alpineagents.errors import NotJSONError, StoreError
from alpineagents.history import MAX_DEPTH, MODEL, TOOL_RESULT
from alpineagents.testing import FunctionModel, call
from tests.json_values import (
    ID_PATTERN,
    LONE_SURROGATES,
    MAX_DIGITS,
    fits,
    history_of,
    nested,
    same,
)

BUCKET = "properties"

FAST = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# The damage tests look for a load that fails the wrong way: more examples, each cheap.
MANY = settings(FAST, max_examples=50)


# Stores --------------------------------------------------------------------------------------

_prefixes = iter(range(10**9))  # each S3 example gets a prefix of its own: an empty store


@contextlib.contextmanager
def file_store() -> Iterator[Store]:
    with tempfile.TemporaryDirectory() as folder:
        yield FileStore(folder)


@pytest.fixture(scope="module")
def s3(aws_environment: None) -> Iterator[Any]:
    """moto's in-process S3 (``mock_aws``) with one bucket, for the whole module."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


@pytest.fixture(params=["file", "s3"])
def stores(request: pytest.FixtureRequest) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """Makes a fresh, empty store of one kind per hypothesis example."""
    if request.param == "file":
        return file_store
    client = request.getfixturevalue("s3")
    from alpineagents_s3 import S3Store

    @contextlib.contextmanager
    def s3_store() -> Iterator[Any]:
        # A prefix of its own per example: an empty store each time.
        prefix = f"p-{next(_prefixes)}"
        with S3Store(BUCKET, prefix, client=client) as store:  # one client: they are slow to make
            yield store

    return s3_store


# JSON-ish values ------------------------------------------------------------------------------

TEXT = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(codec="utf-8"), max_size=6),  # any code point UTF-8 has
    LONE_SURROGATES,
)
BIG_INTS = st.integers(MAX_DIGITS - 3, MAX_DIGITS + 3).flatmap(
    lambda digits: st.sampled_from([10 ** (digits - 1), -(10 ** (digits - 1)) - 7])
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    BIG_INTS,
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
)


DEEP = st.tuples(st.integers(MAX_DEPTH - 3, MAX_DEPTH + 2), SCALARS).map(lambda t: nested(*t))
VALUES = st.recursive(
    st.one_of(SCALARS, DEEP),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(TEXT, inner, max_size=4),
        # A key JSON would turn into text: not a JSON object key.
        st.dictionaries(st.integers(0, 3), inner, min_size=1, max_size=2),
    ),
    max_leaves=12,
)


# Ids ------------------------------------------------------------------------------------------


@FAST
@given(state_id=st.from_regex(ID_PATTERN, fullmatch=True))
def test_a_valid_id_round_trips(stores: Callable[[], Any], state_id: str) -> None:
    with stores() as store:
        state = State("task", id=state_id, data={"id": state_id})
        assert store.save(state)
        loaded = store.load(state_id)
        assert (loaded.id, loaded.task, loaded.data) == (state_id, "task", {"id": state_id})
        assert [s.id for s in store.list()] == [state_id]


INVALID_IDS = st.one_of(
    st.text(max_size=140).filter(lambda s: not ID_PATTERN.fullmatch(s)),
    st.from_regex(ID_PATTERN, fullmatch=True).map(lambda s: s + "/.."),
    st.integers(0, 128).map(lambda n: "a" * (129 + n)),
    st.sampled_from(["", ".", "..", "a b", "é", "a\x00", "../x", "a/b", "A\udce9"]),
)


@FAST
@given(state_id=INVALID_IDS)
def test_an_invalid_id_is_refused_naming_it(stores: Callable[[], Any], state_id: str) -> None:
    with pytest.raises(ValueError, match="invalid State id") as made:
        State("task", id=state_id)
    assert repr(state_id) in str(made.value)
    with stores() as store:
        for use in (store.load, store.get):
            with pytest.raises(ValueError, match="invalid State id") as used:
                use(state_id)
            assert repr(state_id) in str(used.value)
        assert store.list() == []


# Data -----------------------------------------------------------------------------------------


@FAST
@given(value=VALUES)
def test_data_is_saved_and_loaded_back_or_refused_up_front_naming_its_path(
    stores: Callable[[], Any], value: Any
) -> None:
    with stores() as store:
        state = State("task", data={"before": 1})
        state.add_user_message("hello")
        store.save(state)
        stored = history_of(store.load(state.id))

        state.data = {"v": value}
        state.add_user_message("after the value")
        if fits(value, depth=1):
            assert store.save(state)
            loaded = store.load(state.id)
            assert same(loaded.data, {"v": value})
            assert history_of(loaded) == history_of(state)
        else:
            with pytest.raises(NotJSONError) as refused:
                store.save(state)
            assert "state.data['v']" in str(refused.value)
            # Nothing was written: the store has the State as before.
            kept = store.load(state.id)
            assert (kept.data, history_of(kept)) == ({"before": 1}, stored)
            # Fixed, the same State saves everything it holds.
            state.data = {"v": "fixed"}
            assert store.save(state)
            loaded = store.load(state.id)
            assert loaded.data == {"v": "fixed"}
            assert history_of(loaded) == history_of(state)


@FAST
@given(value=VALUES)
def test_a_new_state_with_data_that_cannot_be_kept_writes_nothing(
    stores: Callable[[], Any], value: Any
) -> None:
    with stores() as store:
        state = State("task", id="new", data={"v": value})
        if fits(value, depth=1):
            assert store.save(state)
            assert same(store.load("new").data, {"v": value})
            return
        with pytest.raises(NotJSONError, match=r"state\.data\['v'\]"):
            store.save(state)
        assert store.get("new") is None
        state.data = {}
        assert store.save(state)
        assert store.load("new").data == {}


# Tool input and results -------------------------------------------------------------------------


@FAST
@given(tool_input=VALUES, result=VALUES, run_async=st.booleans())
def test_tool_input_and_results_never_end_a_run_and_the_state_loads_as_it_ran(
    stores: Callable[[], Any], tool_input: Any, result: Any, run_async: bool
) -> None:
    ran: list[Any] = []

    def echo(v: Any) -> Any:
        """Give back a value."""
        ran.append(v)
        return result

    def respond(request: ModelRequest) -> Any:
        turns = sum(1 for m in request.messages if m["role"] == "assistant")
        return [call("echo", v=tool_input)] if turns == 0 else "done"

    with stores() as store:
        agent = Agent(FunctionModel(respond), tools=[echo], store=store)
        state = State("task")

        def go() -> Any:
            # aiobotocore does not run under mock_aws: the async API on FileStore only.
            if run_async and isinstance(store, FileStore):
                import asyncio

                return asyncio.run(agent.arun(state))
            return agent.run(state)

        assert go() == "done"
        # The tool ran exactly when its input could be saved: in the response entry's data,
        # ["content"][0]["input"]["v"] is 4 levels down.
        runs_expected = 1 if fits(tool_input, depth=4) else 0
        assert len(ran) == runs_expected
        [entry] = [e for e in state.history if e.kind == TOOL_RESULT]
        if not runs_expected:
            assert entry.text.startswith("Invalid input for tool 'echo'")
            assert "tool input of" in entry.text
        elif isinstance(result, str) and not fits(result):
            # Text is kept as it is, so it must be text JSON holds: an error result instead.
            assert entry.data["is_error"]
            assert "tool result of" in entry.text and "(echo)" in entry.text
        loaded = store.load(state.id)
        assert history_of(loaded) == history_of(state)
        model_entry = next(e for e in loaded.history if e.kind == MODEL)
        sent_input = model_entry.as_model().tool_calls[0]["input"]
        assert same(sent_input, {"v": tool_input} if runs_expected else {})


# Damaged objects --------------------------------------------------------------------------------


def saved_state(store: Store) -> State:
    """A State with a tool call, its result and a reply, saved."""

    def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    def respond(request: ModelRequest) -> Any:
        turns = sum(1 for m in request.messages if m["role"] == "assistant")
        return [call("lookup", q="x")] if turns == 0 else "done"

    state = State("task", id="damaged", data={"n": 1, "text": "café"})
    Agent(FunctionModel(respond), tools=[lookup], store=store).run(state)
    return state


Damage = tuple[str, int, int]  # how, where (a fraction of the length, in 1/1000), what


DAMAGE = st.tuples(
    st.sampled_from(["flip", "cut", "splice"]), st.integers(0, 999), st.integers(1, 255)
)


def damaged(data: bytes, damage: Damage) -> bytes:
    how, where, what = damage
    at = len(data) * where // 1000
    if how == "flip":
        return data[:at] + bytes([data[at] ^ what]) + data[at + 1 :]
    if how == "cut":
        return data[:at]
    return data[:at] + bytes([what]) * (what % 7 + 1) + data[at:]


def load_or_refuse(store: Store, state: State) -> None:
    """``load`` gives a State or raises a StoreError: never another exception."""
    try:
        loaded = store.load(state.id)
    except StoreError:
        return
    except Exception as e:  # noqa: BLE001 - the property: nothing else
        pytest.fail(f"load raised {type(e).__name__}, not a StoreError: {e}")
    assert loaded.id == state.id


@MANY
@given(which=st.integers(0, 10), damage=DAMAGE)
def test_a_damaged_file_is_read_or_refused_with_a_store_error(which: int, damage: Damage) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = FileStore(folder)
        state = saved_state(store)
        files = sorted(p for p in Path(folder).rglob("*") if p.is_file())
        path = files[which % len(files)]
        path.write_bytes(damaged(path.read_bytes(), damage))
        load_or_refuse(store, state)


@MANY
@given(which=st.integers(0, 10), damage=DAMAGE)
def test_a_damaged_s3_object_is_read_or_refused_with_a_store_error(
    s3: Any, which: int, damage: Damage
) -> None:
    from alpineagents_s3 import S3Store

    prefix = f"d-{next(_prefixes)}"
    with S3Store(BUCKET, prefix, client=s3) as store:
        state = saved_state(store)
        keys = sorted(
            item["Key"]
            for item in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/")["Contents"]
        )
        key = keys[which % len(keys)]
        stored = s3.get_object(Bucket=BUCKET, Key=key)
        # The object's metadata (the base of an entry, the count of a snapshot) is kept.
        s3.put_object(
            Bucket=BUCKET,
            Key=key,
            Body=damaged(stored["Body"].read(), damage),
            Metadata=stored.get("Metadata", {}),
        )
        load_or_refuse(store, state)
