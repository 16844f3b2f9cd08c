"""Bad input, property by property (hypothesis), on FileStore: refused as documented, naming
the thing at fault, and nothing already saved is lost.

* State ids: an invalid one (any text, lone surrogates, 129 characters and more, digits of
  other scripts, fullwidth letters, not a str) is a ``ValueError`` naming it, from ``State``
  and from every store method, and the store is left as it was; a valid one round-trips.
* ``state.data``: a value is saved and loaded back equal (tuples as lists), or refused by
  ``save`` with ``NotJSONError`` (a ``TypeError``) whose path into ``state.data`` leads to a
  value that does not fit; the store keeps the State as it was, and the State fixed saves
  everything it holds. Values: NaN, infinities, ints at and past the digits Python reads back,
  numbers at the edges of floats and 64-bit ints, lone surrogates in text and keys, nesting at
  and past the limit, keys that are not text, tuples, sets, bytes, objects of a class.
* Tool call arguments and tool results of the same values: the run ends as it should, the tool
  runs exactly when its input can be saved, and the State loads back as it ran.
* Damaged and foreign files (a link, a fifo, a folder, empty, bytes flipped, cut or spliced,
  not UTF-8, a JSON array, huge numbers, NaN, deep nesting, a newer schema, a State folder that
  is a file): ``load`` raises ``CorruptStateError`` or ``SchemaVersionError`` naming the State
  and its folder (never another exception, never a hang), a save of a copy loaded before is
  refused by a store error and writes nothing (or, for damage to an entry it does not read,
  only appends), and another State of the store loads as it was.

Whether a value fits is decided by an oracle written from the user guide's rules and compared
with what the library does.

Examples: 40 a test by default (the module takes a few seconds). The long run sets the count
a test:

    ALPINEAGENTS_PROPERTY_EXAMPLES=2000 .venv/bin/python -m pytest -p no:cacheprovider \\
        tests/test_bad_input_properties.py --hypothesis-show-statistics

(6 tests: 12,000 examples; hypothesis prints each test's count and time.)
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import re
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alpineagents import (
    Agent,
    ConcurrentWriteError,
    CorruptStateError,
    FileStore,
    ModelRequest,
    SchemaVersionError,
    State,
    StoreError,
)
from alpineagents.errors import NotJSONError
from alpineagents.filestore import ENTRIES, SNAPSHOT
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

EXAMPLES = int(os.environ.get("ALPINEAGENTS_PROPERTY_EXAMPLES") or 40)

PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@contextlib.contextmanager
def store_folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


def files(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: a file's bytes, else what it is (never opened)."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = f"link to {os.readlink(path)}"
        elif path.is_fifo():
            found[name] = "fifo"
        elif path.is_dir():
            found[name] = "folder"
        else:
            found[name] = path.read_bytes()
    return found


# Ids --------------------------------------------------------------------------------------------

INVALID_IDS = st.one_of(
    st.text(max_size=140).filter(lambda s: not ID_PATTERN.fullmatch(s)),
    st.from_regex(ID_PATTERN, fullmatch=True).map(lambda s: s + "/.."),
    st.integers(129, 300).map(lambda n: "a" * n),
    st.text(st.characters(categories=["Nd"], exclude_characters="0123456789"), min_size=1),
    st.sampled_from(
        ["١٢٣", "a٣", "\uff41\uff42", "run\u200b", "é", "a b", ".", "..", "", "-\n", "a\x00"]
    ),
    st.sampled_from(["\ud800", "a\udfff", "caf\udce9"]),
    st.one_of(st.integers(), st.binary(max_size=4), st.floats()),  # not a str at all (None: random)
)


@PROPERTY
@given(state_id=INVALID_IDS, mode=st.sampled_from(["sync", "async"]))
def test_an_invalid_id_is_refused_naming_it_and_the_store_is_untouched(
    state_id: Any, mode: str
) -> None:
    with pytest.raises(ValueError, match="invalid State id") as made:
        State("task", id=state_id)
    assert repr(state_id) in str(made.value)
    with store_folder() as root:
        store = FileStore(root)
        store.save(State("a bystander", id="kept"))
        before = files(root)
        calls: list[Any] = [
            lambda: store.load(state_id),
            lambda: store.get(state_id),
            lambda: store.read(state_id),
            lambda: store.delete(state_id, purge=True),
            lambda: store.write(state_id, [], {"v": 1}, create=True),
        ]
        if mode == "async":
            calls = [
                lambda: asyncio.run(store.aload(state_id)),
                lambda: asyncio.run(store.aget(state_id)),
                lambda: asyncio.run(store.aread(state_id)),
                lambda: asyncio.run(store.adelete(state_id)),
                lambda: asyncio.run(store.awrite(state_id, [], None)),
            ]
        for use in calls:
            with pytest.raises(ValueError, match="invalid State id") as used:
                use()
            assert repr(state_id) in str(used.value)
        assert files(root) == before
        assert [s.id for s in store.list()] == ["kept"]


@PROPERTY
@given(state_id=st.from_regex(ID_PATTERN, fullmatch=True))
def test_a_valid_id_round_trips_and_deletes(state_id: str) -> None:
    with store_folder() as root:
        store = FileStore(root)
        assert store.save(State("task", id=state_id, data={"id": state_id}))
        assert store.load(state_id).data == {"id": state_id}
        assert [s.id for s in store.list(limit=1)] == [state_id]
        assert store.delete(state_id, purge=True).state_id == state_id
        assert os.listdir(root) == []


# Values -----------------------------------------------------------------------------------------


class Opaque:
    """An object of a class of its own: not a JSON value."""

    def __repr__(self) -> str:
        return "Opaque()"


@dataclass
class Point:
    x: int


TEXT = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(codec="utf-8"), max_size=6),
    LONE_SURROGATES,
)
BIG_INTS = st.integers(MAX_DIGITS - 2, MAX_DIGITS + 2).flatmap(
    lambda digits: st.sampled_from([10 ** (digits - 1), -(10 ** (digits - 1)) - 7])
)
EDGE_NUMBERS = st.sampled_from(
    [
        2**53,
        2**53 + 1,
        -(2**63),
        2**63 - 1,
        2**64,
        -(2**64) - 1,
        5e-324,
        -5e-324,
        2.2250738585072014e-308,
        1.7976931348623157e308,
        -1.7976931348623157e308,
        -0.0,
        0.1,
        1e16,
        1e-7,
    ]
)
PYTHON_ONLY = st.one_of(
    st.sets(st.integers(0, 3), max_size=2),
    st.frozensets(st.text(max_size=2), max_size=2),
    st.binary(max_size=3),
    st.builds(Opaque),
    st.builds(Point, st.integers()),
    st.complex_numbers(max_magnitude=10, allow_nan=False),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    BIG_INTS,
    EDGE_NUMBERS,
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
    PYTHON_ONLY,
)


DEEP = st.tuples(st.integers(MAX_DEPTH - 3, MAX_DEPTH + 2), SCALARS).map(lambda t: nested(*t))
KEYS_NOT_TEXT = st.one_of(st.integers(0, 3), st.none(), st.floats(0, 1), st.tuples(st.integers()))
VALUES = st.recursive(
    st.one_of(SCALARS, DEEP),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(TEXT, inner, max_size=4),
        st.dictionaries(KEYS_NOT_TEXT, inner, min_size=1, max_size=2),
    ),
    max_leaves=12,
)


_INDEX = re.compile(r"\[('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\d+)\]")
_PATH = re.compile(r"state\.data((?:\[(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\d+)\])*)")


def named_place(message: str, data: dict[str, Any]) -> tuple[Any, int] | None:
    """The value the message's path into ``state.data`` names, and its depth; None if cut."""
    if "nested more than" in message:
        return None  # the path is shortened: checked by its start alone
    found = _PATH.search(message)
    assert found is not None, message
    value: Any = data
    depth = 0
    for index in _INDEX.findall(found[1]):
        value = value[ast.literal_eval(index)]
        depth += 1
    return value, depth


@PROPERTY
@given(value=VALUES, mode=st.sampled_from(["sync", "async"]))
def test_data_is_saved_and_loaded_back_or_refused_naming_a_path_to_what_does_not_fit(
    value: Any, mode: str
) -> None:
    def save(store: FileStore, state: State) -> bool:
        return asyncio.run(store.asave(state)) if mode == "async" else store.save(state)

    with store_folder() as root:
        store = FileStore(root)
        state = State("task", data={"before": 1})
        state.add_user_message("hello")
        save(store, state)
        before = files(root)

        state.data = {"v": value}
        state.add_user_message("after the value")
        if fits(value, depth=1):
            assert save(store, state)
            loaded = store.load(state.id)
            assert same(loaded.data, {"v": value})
            assert history_of(loaded) == history_of(state)
            return
        with pytest.raises(NotJSONError) as refused:
            save(store, state)
        assert isinstance(refused.value, TypeError)
        message = str(refused.value)
        assert "state.data['v']" in message, message
        place = named_place(message, state.data)
        if place is not None:
            at, depth = place
            assert not fits(at, depth), (message, at)
        assert files(root) == before  # nothing written
        state.data = {"v": "fixed"}
        assert save(store, state)
        loaded = store.load(state.id)
        assert loaded.data == {"v": "fixed"}
        assert [e.text for e in loaded.history] == ["task", "hello", "after the value"]


@PROPERTY
@given(value=VALUES)
def test_a_new_state_with_data_that_cannot_be_kept_writes_nothing(value: Any) -> None:
    with store_folder() as root:
        store = FileStore(root)
        state = State("task", id="new", data={"v": value})
        if fits(value, depth=1):
            assert store.save(state)
            assert same(store.load("new").data, {"v": value})
            return
        with pytest.raises(TypeError, match=r"state\.data\['v'\]"):
            store.save(state)
        assert os.listdir(root) == []
        state.data = {}
        assert store.save(state)
        assert store.load("new").data == {}


# Tool input and results -------------------------------------------------------------------------


@PROPERTY
@given(tool_input=VALUES, result=VALUES, run_async=st.booleans())
def test_tool_input_and_results_of_any_value_never_end_a_run(
    tool_input: Any, result: Any, run_async: bool
) -> None:
    ran: list[Any] = []

    def echo(v: Any) -> Any:
        """Give back a value."""
        ran.append(v)
        return result

    def respond(request: ModelRequest) -> Any:
        turns = sum(1 for m in request.messages if m["role"] == "assistant")
        return [call("echo", v=tool_input)] if turns == 0 else "done"

    with store_folder() as root:
        store = FileStore(root)
        agent = Agent(FunctionModel(respond), tools=[echo], store=store)
        state = State("task")
        answer = asyncio.run(agent.arun(state)) if run_async else agent.run(state)
        assert answer == "done"
        # The input is 4 levels down in the response entry: data["content"][0]["input"]["v"].
        runs = 1 if fits(tool_input, depth=4) else 0
        assert len(ran) == runs
        [entry] = [e for e in state.history if e.kind == TOOL_RESULT]
        if not runs:
            assert "tool input of" in entry.text and "(echo)" in entry.text, entry.text
        assert fits(entry.text)
        loaded = store.load(state.id)
        assert history_of(loaded) == history_of(state)
        sent = next(e for e in loaded.history if e.kind == MODEL).as_model().tool_calls[0]
        assert same(sent["input"], {"v": tool_input} if runs else {})


# Damaged and foreign files ----------------------------------------------------------------------

KINDS = [
    "symlink",
    "fifo",
    "folder",
    "empty",
    "flip",
    "cut",
    "splice",
    "not utf-8",
    "json array",
    "huge int",
    "nan",
    "deep",
    "newer schema",
    "state folder is a file",
]
DAMAGE = st.tuples(
    st.sampled_from(KINDS),
    st.sampled_from([SNAPSHOT, ENTRIES]),
    st.integers(0, 999),  # where, in thousandths of the file
    st.integers(1, 255),  # a byte
)


def damage(folder: Path, kind: str, target: str, where: int, byte: int) -> None:
    path = folder / target
    data = path.read_bytes()
    at = len(data) * where // 1000
    if kind == "symlink":
        elsewhere = folder.parent.parent / f"copy-{target}"
        elsewhere.write_bytes(data)
        path.unlink()
        path.symlink_to(elsewhere)
    elif kind == "fifo":
        path.unlink()
        os.mkfifo(path, 0o600)
    elif kind == "folder":
        path.unlink()
        path.mkdir()
    elif kind == "state folder is a file":
        for child in folder.iterdir():
            child.unlink()
        folder.rmdir()
        folder.write_bytes(data)
    else:
        path.write_bytes(damaged_bytes(data, kind, at, byte))


def damaged_bytes(data: bytes, kind: str, at: int, byte: int) -> bytes:
    """The bytes of a file damaged ``kind``-wise at offset ``at`` (with ``byte``)."""
    if kind == "empty":
        return b""
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ byte]) + data[at + 1 :]
    if kind == "cut":
        return data[:at]
    if kind == "splice":
        return data[:at] + bytes([byte]) * (byte % 7 + 1) + data[at:]
    if kind == "not utf-8":
        return data[:at] + b"\xff\xfe" + data[at:]
    if kind == "json array":
        return b"[" + data.rstrip(b"\n") + b"]\n"
    if kind == "huge int":
        data = data.replace(b'"seq":0', b'"seq":' + b"7" * 5000, 1)
        return data.replace(b'"entries":', b'"entries":' + b"9" * 5000, 1)
    if kind == "nan":
        return data.replace(b'"data":{}', b'"data":{"x":NaN}')
    if kind == "deep":
        return b"[" * 100_000 + b"]" * 100_000 + b"\n"
    assert kind == "newer schema", kind
    return data.replace(b'"v":1', b'"v":7', 1)


@contextlib.contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail instead of hanging (a fifo opened for reading waits for a writer)."""

    def timeout(signum: int, frame: object) -> None:
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@PROPERTY
@given(how=DAMAGE, mode=st.sampled_from(["sync", "async"]))
def test_a_damaged_or_foreign_file_is_refused_naming_the_state_and_loses_nothing(
    how: tuple[str, str, int, int], mode: str
) -> None:
    kind, target, where, byte = how
    with store_folder() as base, within(20):
        root = base / "runs"
        store = FileStore(root)
        state = State("task", id="s", data={})
        state.add_user_message("hello")
        store.save(state)
        store.save(State("a bystander", id="other"))
        bystander = files(root / "other")
        copy = store.load("s")
        damage(root / "s", kind, target, where, byte)
        before = files(root)
        fresh = FileStore(root)
        try:
            asyncio.run(fresh.aload("s")) if mode == "async" else fresh.load("s")
        except (CorruptStateError, SchemaVersionError) as e:
            message = str(e)
            assert "'s'" in message and str(root / "s") in message, message
        except Exception as e:  # noqa: BLE001 - the property: nothing else
            pytest.fail(f"load raised {type(e).__name__}, not a store error: {e}")
        # A save of a copy loaded before: refused by a store error writing nothing, or (damage
        # in an entry the save does not read) it appends and the file begins as it did.
        copy.add_user_message("after the damage")
        refusal: StoreError | None = None
        try:
            asyncio.run(store.asave(copy)) if mode == "async" else store.save(copy)
        except (CorruptStateError, SchemaVersionError, ConcurrentWriteError) as e:
            refusal = e
        except StoreError as e:  # a StateExistsError would take the copy's save for a create
            pytest.fail(f"save raised {type(e).__name__}: {e}")
        if refusal is not None:
            assert "'s'" in str(refusal)
            assert files(root) == before
        else:
            entries = str(Path("s", ENTRIES))
            after, kept = files(root)[entries], before[entries]
            assert isinstance(after, bytes) and isinstance(kept, bytes), (after, kept)
            assert after.startswith(kept)
        assert files(root / "other") == bystander
        assert fresh.load("other").task == "a bystander"
