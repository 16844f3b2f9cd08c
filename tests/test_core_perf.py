"""What issue 10 changed in the core, pinned without timing anything.

* The stored entry form: a model entry whose text is its text blocks can be kept once (read
  now, written by a later release: here, with ``_WRITE_COMPACT`` set); entries of the form
  before (``text`` in every entry) load exactly as they did.
* FileStore's load: a chunk of lines decoded at once, each line parsed on its own, no message
  built for a good line, a damaged line still named by its number; peak memory within 3x the
  entries' JSON.
* The rebuild of an entry: the usual shapes checked by type tests alone, every other entry by
  the full check, and the two never disagree (on any field of any kind, swapped for values of
  every JSON type).
* FileStore's snapshot: replaced by one rename onto the old one (so that a power cut leaves
  the old or the new one), and not rewritten when unchanged.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import random
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from alpineagents import Agent, CorruptStateError, FileStore, State
from alpineagents import _serialize as serialize_module
from alpineagents import filestore as filestore_module
from alpineagents._serialize import entry_from_dict, entry_to_dict
from alpineagents.errors import SchemaVersionError
from alpineagents.history import MODEL, TOOL_RESULT, ModelData
from alpineagents.store import SCHEMA_VERSION
from alpineagents.testing import FunctionModel, call
from tests.helpers import big_state

REPLY = "Let me look that up. " * 4


def lookup(q: str) -> str:
    """Look something up."""
    return f"rows for {q}"


def agent_state(store: FileStore, steps: int = 3) -> State:
    """A State an Agent ran for ``steps`` tool-using steps, saved in ``store``."""
    made = 0

    def respond(request: Any) -> Any:
        nonlocal made
        made += 1
        if made > steps:
            return "All done."
        return [{"type": "text", "text": REPLY}, call("lookup", q=f"q{made}")]

    agent = Agent(FunctionModel(respond), tools=[lookup], store=store)
    state = State("look things up", id="run")
    agent.run(state)
    return state


def stored_lines(store: FileStore, state_id: str) -> list[dict[str, Any]]:
    text = (store.path / state_id / "entries.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def old_form(entry: dict[str, Any], text: str) -> dict[str, Any]:
    """An entry as alpineagents wrote it before issue 10: ``text`` in every entry, version 1."""
    return {"v": 1, "seq": entry["seq"], "kind": entry["kind"], "text": text,
            "at": entry["at"], "data": entry["data"]}  # fmt: skip


# The stored form ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def compact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Model entries written compact, as a later release will (this one only reads them)."""
    monkeypatch.setattr(serialize_module, "_WRITE_COMPACT", True)


def test_a_model_entry_keeps_its_text_once_and_loads_with_it(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = agent_state(store)
    lines = stored_lines(store, "run")
    models = [line for line in lines if line["kind"] == MODEL]
    assert len(models) == 4
    for line in models:
        assert "text" not in line
        assert line["v"] == 2 == SCHEMA_VERSION
        assert REPLY in json.dumps(line) or line["data"]["content"][0]["text"] == "All done."
    # Every other object keeps the form a version-1 alpineagents reads.
    assert {line["v"] for line in lines if line["kind"] != MODEL} == {1}
    snapshot = json.loads((tmp_path / "run" / "snapshot.json").read_text())
    assert snapshot["v"] == 1
    loaded = FileStore(tmp_path).load("run")
    assert loaded.history == state.history
    assert [e.text for e in loaded.history if e.kind == MODEL] == [REPLY] * 3 + ["All done."]


def test_a_model_entry_whose_text_is_not_its_blocks_keeps_its_text(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = State("t", id="s")
    two: list[dict[str, Any]] = [
        {"type": "text", "text": "a"},
        {"type": "thinking", "x": 1},
        {"type": "text", "text": "b"},
    ]
    state.append(MODEL, "ab", ModelData(two, "end_turn").to_data())  # joined: stored once
    state.append(MODEL, "my own words", ModelData(two, "end_turn").to_data())
    state.append(MODEL, "", ModelData([], "end_turn").to_data())  # no blocks, no text
    store.save(state)
    lines = stored_lines(store, "s")
    assert ["text" in line for line in lines] == [True, False, True, False]
    assert lines[2]["text"] == "my own words" and lines[2]["v"] == 1
    assert store.load("s").history == state.history


def test_entries_of_the_form_before_load_as_they_did(tmp_path: Path) -> None:
    # The same State in two folders: as this version stores it, and as one before it did.
    store = FileStore(tmp_path)
    state = agent_state(store)
    old = tmp_path / "old"
    old.mkdir(mode=0o700)
    lines = [old_form(entry_to_dict(e), e.text) for e in state.history]
    (old / "entries.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (old / "snapshot.json").write_bytes((tmp_path / "run" / "snapshot.json").read_bytes())
    snapshot = json.loads((old / "snapshot.json").read_text())
    snapshot["id"] = "old"
    (old / "snapshot.json").write_text(json.dumps(snapshot))

    before = FileStore(tmp_path).load("old")
    now = FileStore(tmp_path).load("run")
    assert before.history == now.history == state.history
    assert (
        (before.stopped_by, before.answer) == (now.stopped_by, now.answer) == ("reply", "All done.")
    )
    # Saving more appends the new form after the old lines; all of it loads.
    before.add_user_message("and more")
    FileStore(tmp_path).save(before)
    again = FileStore(tmp_path).load("old")
    assert [e.text for e in again.history] == [e.text for e in state.history] + ["and more"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (None, r"history entry 1 \(model\): text must be a str, not null"),
        (5, r"history entry 1 \(model\): text must be a str, not 5 \(int\)"),
        (["x"], r"history entry 1 \(model\): text must be a str"),
    ],
)
def test_a_model_entry_with_a_text_of_another_type_is_refused(
    tmp_path: Path, text: Any, words: str
) -> None:
    store = FileStore(tmp_path)
    agent_state(store, steps=1)
    path = tmp_path / "run" / "entries.jsonl"
    lines = stored_lines(store, "run")
    assert "text" not in lines[1]
    lines[1]["text"] = text
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(CorruptStateError, match=r"^State 'run' in FileStore\(.*\), " + words):
        FileStore(tmp_path).load("run")


def test_a_model_entry_without_text_is_checked_like_one_with_it(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    agent_state(store, steps=1)
    path = tmp_path / "run" / "entries.jsonl"
    good = path.read_text().splitlines()
    lines = [json.loads(line) for line in good]
    lines[1]["data"]["content"][0]["text"] = 7
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    words = r"entry 1 \(model\): data\['content'\]\[0\]\['text'\] must be a str, not 7"
    with pytest.raises(CorruptStateError, match=words):
        FileStore(tmp_path).load("run")
    # A lone surrogate in a text block is refused as it is in a text field.
    good[1] = good[1].replace("Let me", "\\ud800Let me", 1)
    path.write_text("\n".join(good) + "\n")
    with pytest.raises(CorruptStateError, match=r"entry 1 \(model\): .*lone surrogate"):
        FileStore(tmp_path).load("run")


# Loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("compact", [True, False])
def test_an_agents_entries_load_without_the_full_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compact: bool
) -> None:
    # What a run saves (its task, replies with tool calls, results, the person's message) is
    # all of the usual shape, with model entries of either form: none is checked one field at
    # a time.
    monkeypatch.setattr(serialize_module, "_WRITE_COMPACT", compact)
    store = FileStore(tmp_path)
    state = agent_state(store, steps=5)
    state.add_user_message("thanks")
    store.save(state)
    full: list[Any] = []
    monkeypatch.setattr(serialize_module, "_checked_entry", lambda *args: full.append(args))
    loaded = FileStore(tmp_path).load("run")
    assert full == [] and loaded.history == state.history
    assert {e.kind for e in loaded.history} == {"task", "model", "tool_result", "user"}
    versions = {line["v"] for line in stored_lines(store, "run") if line["kind"] == MODEL}
    assert versions == ({2} if compact else {1})


def test_a_load_builds_no_message_for_good_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    state = big_state(301)
    store.save(state)
    monkeypatch.setattr(filestore_module, "_READ_CHUNK", 4096)  # many chunks, lines across them
    wheres: list[str] = []
    real = filestore_module.loads  # type: ignore[attr-defined]

    def counting(raw: bytes | str, where: str) -> Any:
        wheres.append(where)
        return real(raw, where)

    monkeypatch.setattr(filestore_module, "loads", counting)
    assert store.load("big").history == state.history
    # The snapshot alone, named with its State.
    assert wheres == [f"{tmp_path / 'big' / 'snapshot.json'} (State 'big')"]


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda line: line[:-3], "is not valid JSON"),
        (lambda line: line + b" " + line, "is not valid JSON: Extra data"),
        (lambda line: line + b"," + line, "is not valid JSON: Extra data"),  # two values
        (lambda line: b"\xff" + line, "is not valid JSON"),  # not UTF-8
    ],
)
def test_a_damaged_line_is_named_by_its_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: Any, words: str
) -> None:
    store = FileStore(tmp_path)
    store.save(big_state(61))
    monkeypatch.setattr(filestore_module, "_READ_CHUNK", 2048)
    path = tmp_path / "big" / "entries.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[40] = damage(lines[40])
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(CorruptStateError, match=rf"line 41 of {path}.* {words}"):
        FileStore(tmp_path).load("big")


def test_whitespace_around_a_line_and_a_torn_last_line_load_as_before(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = big_state(21)
    store.save(state)
    path = tmp_path / "big" / "entries.jsonl"
    lines = path.read_bytes().split(b"\n")[:-1]
    lines[3] = b"  " + lines[3] + b"\r"
    path.write_bytes(b"\n".join(lines) + b'\n{"v":1,"seq":21,"ki')  # a killed append
    assert FileStore(tmp_path).load("big").history == state.history


def test_a_line_only_json_loads_takes_loads_as_before(tmp_path: Path) -> None:
    # The quick parser refuses a byte order mark; json.loads of the line's bytes takes it, as
    # the line-by-line load always did, and the rest of the chunk loads.
    store = FileStore(tmp_path)
    state = big_state(21)
    store.save(state)
    path = tmp_path / "big" / "entries.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[5] = b"\xef\xbb\xbf" + lines[5]
    path.write_bytes(b"\n".join(lines))
    loaded = FileStore(tmp_path).load("big")
    assert loaded.history == state.history


def parsed(parse: Any, line: bytes) -> tuple[str, str]:
    try:
        return ("value", repr(parse(line)))
    except (ValueError, RecursionError):
        return ("refused", "")


EDGES = [
    b"NaN", b"-Infinity", b"+Infinity", b"nan", b"1e400", b"-1e400", b"1" * 4301, b"1" * 4300,
    b'"\\ud800"', b'"\\udc00x"', b'"\\ud83d\\ude00"', b'"\xed\xa0\x80"', b'"\xff"',
    b'"\xf4\x90\x80\x80"', b'{"a":1,"a":2}', b'{"b":1,"a":2,"b":3}', b'"a\tb"', b'"a\x00"',
    b" 1 ", b"\t1\r", b"\x0c1", b"\x0b1", b"1 2", b"01", b"-01", b"1.", b".5", b"1e", b"1E5",
    b"-0", b"-0.0", b"0.1e1", b"\xef\xbb\xbf1", b"[" * 300 + b"]" * 300, b"1\x00", b"[1,]",
    b'{"a":1,}', b"'a'", b'"\\x41"', b"", b"  ", b"true", b"null", b"9" * 20 + b".5",
    b"1" + b"0" * 400 + b".0", b'{"a" :1}', b"[ ]",
]  # fmt: skip


def test_the_quick_parser_takes_a_line_only_as_json_loads_does() -> None:
    # Lines it takes, it takes with json.loads's value; lines it refuses go to json.loads.
    # Damaged lines: the stored forms of an entry with bytes swapped, added or cut.
    rng = random.Random(10)
    good = [json.dumps(entry_to_dict(e)).encode() for e in big_state(3).history]
    good.append(b'{"a":[1,2.5,"x\\u00e9",true],"b":null,"c":-0.5e3}')
    alphabet = b' \t\r\n\x0b\x00"\\/{}[],:-+.0123456789eEnultrfasNIy\xc3\xa9\xed\xa0\x80\xff'
    lines = list(EDGES)
    for _ in range(30_000):
        damaged = bytearray(rng.choice(good))
        for _ in range(rng.randint(1, 3)):
            at, how = rng.randrange(len(damaged) + 1), rng.random()
            if how < 0.4:
                damaged[at : at + 1] = bytes([rng.choice(alphabet)])
            elif how < 0.7:
                damaged.insert(at, rng.choice(alphabet))
            else:
                del damaged[at : at + rng.randint(1, 4)]
        lines.append(bytes(damaged))
    taken = 0
    for line in lines:
        quick = parsed(filestore_module._quick_json, line)
        if quick[0] == "value":
            taken += 1
            assert quick == parsed(json.loads, line), line
    assert 5_000 < taken < len(lines) - 5_000  # both outcomes well tried


def traced_peak(function: Any) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        function()
        return int(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()


def test_a_load_peaks_within_3x_the_json_of_its_entries(tmp_path: Path) -> None:
    # Entries as the issue measured them: ~420 B replies and ~1.4 KB tool results.
    store = FileStore(tmp_path)
    state = State("many steps", id="big")
    for k in range(1, 2001, 2):
        tool_call = {"type": "tool_call", "id": f"c{k}", "name": "lookup", "input": {"q": k}}
        reply = REPLY * 5
        data = ModelData([{"type": "text", "text": reply}, tool_call], "tool_use").to_data()
        state.append(MODEL, reply, data)
        state.append(TOOL_RESULT, "alpha,1\nbeta,2\n" * 90, {"call_id": f"c{k}", "name": "q"})
    store.save(state)
    raw = (tmp_path / "big" / "entries.jsonl").read_bytes()
    assert traced_peak(lambda: store.load("big")) <= 3 * len(raw)
    # Small entries cost Python more than their JSON, even in one json.loads of them all
    # (which shares key strings between entries; a line parsed on its own cannot): within
    # 1.5x of that, then.
    small = FileStore(tmp_path / "small")
    small.save(big_state(2001))
    raw = (tmp_path / "small" / "big" / "entries.jsonl").read_bytes()
    whole = b"[" + raw[:-1].replace(b"\n", b",") + b"]"
    assert traced_peak(lambda: small.load("big")) <= 1.5 * traced_peak(lambda: json.loads(whole))


# The rebuild of an entry -----------------------------------------------------------------

AT = "2026-03-01T12:00:00.000001+00:00"
# Entries of every shape the quick check takes, and of shapes it leaves to the full check.
BASES: list[dict[str, Any]] = [
    {"v": 1, "seq": 3, "kind": "task", "text": "t", "at": AT, "data": {}},
    {"v": 1, "seq": 3, "kind": "user", "text": "hi", "at": AT, "data": {"answers": "c1"}},
    {"v": 1, "seq": 3, "kind": "user", "text": "hi", "at": AT, "data": {}},
    {"v": 1, "seq": 3, "kind": "tool_result", "text": "rows", "at": AT,
     "data": {"call_id": "c1", "name": "q", "is_error": False, "unknown": True}},
    {"v": 1, "seq": 3, "kind": "model", "text": "ab", "at": AT,
     "data": {"content": [{"type": "text", "text": "a"},
                          {"type": "tool_call", "id": "c1", "name": "q", "input": {"q": 1}},
                          {"type": "thinking", "thinking": "hm"},
                          {"type": "text", "text": "b"}],
              "stop_reason": "tool_use", "usage": {"input_tokens": 5}, "model": "m"}},
    {"v": 2, "seq": 3, "kind": "model", "at": AT,
     "data": {"content": [{"type": "text", "text": "a"}], "stop_reason": None}},
    {"v": 1, "seq": 3, "kind": "model", "text": "", "at": AT, "data": {}},
    {"v": 1, "seq": 3, "kind": "compaction", "text": "sum", "at": AT,
     "data": {"covers": 1, "usage": {}, "model": None}},
    {"v": 1, "seq": 3, "kind": "notice", "text": "n", "at": AT, "data": {"skipped": [1, 2]}},
    {"v": 1, "seq": 3, "kind": "newer_kind", "text": "n", "at": AT, "data": {"x": 1}},
]  # fmt: skip
MISSING = object()
VALUES: list[Any] = [
    MISSING, None, True, False, 0, 1, 2, 3, -1, 1.5, 10**30, "", "x", "caf\u00e9", "\ud800",
    "text", "tool_call", "tool_use", "model", "user", "Not A Kind", [], ["x"], [1, 2], {},
    {"a": 1}, {"type": "text", "text": "x"}, "2026-01-01T00:00:00", AT, "yesterday",
]  # fmt: skip


def paths_of(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key and index path into ``value``, the value itself first."""
    paths = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            paths += paths_of(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            paths += paths_of(item, (*path, index))
    return paths


def mutants(base: dict[str, Any]) -> list[dict[str, Any]]:
    """``base`` with one value swapped (or removed) at each path, for each of ``VALUES``."""
    made = []
    targets = [p for p in paths_of(base) if p]
    targets += [(key,) for key in ("text", "v", "extra") if key not in base]
    targets += [("data", key) for key in ("content", "usage", "call_id", "answers", "model")]
    for path in targets:
        for value in VALUES:
            mutant = copy.deepcopy(base)
            parent = mutant
            for step in path[:-1]:
                parent = parent[step]
            if isinstance(parent, list):
                if value is MISSING:
                    del parent[path[-1]]
                else:
                    parent[path[-1]] = value
            elif value is MISSING:
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = value
            made.append(mutant)
    made += [copy.deepcopy(base) for base in BASES] + [[], "x", None]  # type: ignore[list-item]
    return made


def outcome(check: Any, raw: Any) -> Any:
    try:
        return check(raw, "State 's'", 7)
    except Exception as e:  # noqa: BLE001 (whatever either raises, the other must too)
        return (type(e), str(e))


def test_the_quick_check_of_an_entry_agrees_with_the_full_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full = serialize_module._checked_entry
    quick = 0
    for base in BASES:
        for raw in mutants(base):
            got, expected = outcome(entry_from_dict, raw), outcome(full, raw)
            assert got == expected, raw
            if isinstance(got, tuple):
                assert issubclass(got[0], CorruptStateError | SchemaVersionError), raw
    # Not vacuous: the usual shapes (and a good share of the mutants) never reach the full check.
    monkeypatch.setattr(serialize_module, "_checked_entry", None)
    for base in BASES[:7]:
        assert entry_from_dict(copy.deepcopy(base), "State 's'", 7).seq == 3
    for base in BASES:
        for raw in mutants(base):
            if outcome(entry_from_dict, raw) == outcome(full, raw):
                quick += 1
    print(f"{quick} of the mutants took the quick check")
    assert quick > 1000


def test_an_entry_of_the_usual_shape_with_another_text_takes_the_full_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Non-ASCII text (it may hold a lone surrogate) and a time without a zone go the long way.
    calls: list[Any] = []
    full = serialize_module._checked_entry

    def counted(raw: Any, owner: str, position: int) -> Any:
        calls.append(raw)
        return full(raw, owner, position)

    monkeypatch.setattr(serialize_module, "_checked_entry", counted)
    base = BASES[3]
    assert entry_from_dict({**base, "text": "caf\u00e9"}, "State 's'", 7).text == "caf\u00e9"
    with pytest.raises(CorruptStateError, match=r"history entry 3 \(tool_result\): .*surrogate"):
        entry_from_dict({**base, "text": "\ud800"}, "State 's'", 7)
    with pytest.raises(CorruptStateError, match=r"at must be an ISO 8601 time with a timezone"):
        entry_from_dict({**base, "at": "2026-01-01T00:00:00"}, "State 's'", 7)
    assert len(calls) == 3


# The snapshot ------------------------------------------------------------------------------


def test_a_save_replaces_the_snapshot_by_one_rename_onto_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    agent_state(store, steps=1)
    renames: list[tuple[str, bool]] = []
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        renames.append((Path(dst).name, os.path.exists(dst)))
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    state = store.load("run")
    state.add_user_message("next")
    store.save(state)
    # Onto the old file: ext4 then writes the new data first, so a power cut leaves a whole
    # snapshot, the old or the new one (renaming onto no file would skip that).
    assert renames == [("snapshot.json", True)]
    assert sorted(os.listdir(tmp_path / "run")) == ["entries.jsonl", "snapshot.json"]
    assert FileStore(tmp_path).load("run").history[-1].text == "next"


def test_an_unchanged_snapshot_is_not_rewritten(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = State("t", id="s")
    store.save(state)
    path = tmp_path / "s" / "snapshot.json"
    snapshot = json.loads(path.read_bytes())
    before = os.stat(path)
    store.write("s", [], snapshot)  # byte for byte what is on disk
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # The store object's view is still right: a changed snapshot replaces it.
    store.write("s", [], {**snapshot, "data": {"k": 1}})
    assert os.stat(path).st_ino != before.st_ino
    assert store.load("s").data == {"k": 1}
