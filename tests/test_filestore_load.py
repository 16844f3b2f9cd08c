"""How FileStore reads a State's entries file: a chunk of lines decoded at once, each line
parsed on its own (one value a line), no message built for a good line, a damaged line named
by its number, and a peak of memory within 3x the entries' JSON. The pause of the garbage
collector meanwhile is in test_gc_pause.py."""

from __future__ import annotations

import gc
import json
import random
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from alpineagents import CorruptStateError, FileStore, State
from alpineagents import filestore as filestore_module
from alpineagents._filestore import reading as filestore_reading
from alpineagents._serialize import entry_to_dict
from alpineagents.history import MODEL, TOOL_RESULT, ModelData
from tests.helpers import REPLY, big_state


@pytest.mark.usefixtures("compact_entries")
def test_a_load_builds_no_message_for_good_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path)
    state = big_state(301)
    store.save(state)
    monkeypatch.setattr(filestore_reading, "_READ_CHUNK", 4096)  # many chunks, lines across them
    wheres: list[str] = []
    real = filestore_reading.loads  # type: ignore[attr-defined]

    def counting(raw: bytes | str, where: str) -> Any:
        wheres.append(where)
        return real(raw, where)

    monkeypatch.setattr(filestore_reading, "loads", counting)
    assert store.load("big").history == state.history
    # The snapshot alone, named with its State.
    assert wheres == [f"{tmp_path / 'big' / 'snapshot.json'} (State 'big')"]


@pytest.mark.usefixtures("compact_entries")
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
    monkeypatch.setattr(filestore_reading, "_READ_CHUNK", 2048)
    path = tmp_path / "big" / "entries.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[40] = damage(lines[40])
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(CorruptStateError, match=rf"line 41 of {path}.* {words}"):
        FileStore(tmp_path).load("big")


@pytest.mark.usefixtures("compact_entries")
def test_whitespace_around_a_line_and_a_torn_last_line_load_as_before(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    state = big_state(21)
    store.save(state)
    path = tmp_path / "big" / "entries.jsonl"
    lines = path.read_bytes().split(b"\n")[:-1]
    lines[3] = b"  " + lines[3] + b"\r"
    path.write_bytes(b"\n".join(lines) + b'\n{"v":1,"seq":21,"ki')  # a killed append
    assert FileStore(tmp_path).load("big").history == state.history


@pytest.mark.usefixtures("compact_entries")
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


@pytest.mark.usefixtures("compact_entries")
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
        quick = parsed(filestore_reading._quick_json, line)
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


@pytest.mark.usefixtures("compact_entries")
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


def _saved(tmp_path: Path, state_id: str = "s1", replies: int = 2) -> tuple[FileStore, Path]:
    """A FileStore holding a State of a task and ``replies`` model replies."""
    store = FileStore(tmp_path / "store")
    state = State("the task", id=state_id)
    for n in range(replies):
        state.append("model", f"reply {n}", {"content": [{"type": "text", "text": f"reply {n}"}]})
    store.save(state)
    return store, tmp_path / "store" / state_id / filestore_module.ENTRIES


@pytest.mark.parametrize("chunk", [1 << 18, 7])
def test_value_over_two_lines_beside_a_line_of_two_values_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Every line must hold exactly one value, as the line-by-line load of a4fcc24 required.

    Entry 0 is cut after its ``data`` field and its last key goes on the next line; entries 1
    and 2 share the third line. Three lines, three values: the joined parse takes the file, the
    State loads, though no line but the third is JSON on its own and that one holds two values.
    """
    monkeypatch.setattr(filestore_reading, "_READ_CHUNK", chunk, raising=False)  # not in a4fcc24
    store, path = _saved(tmp_path)
    lines = path.read_bytes().split(b"\n")[:-1]
    assert len(lines) == 3
    first = json.loads(lines[0])
    head = json.dumps(first, separators=(",", ":")).encode()
    assert head.endswith(b"}")
    # {"v":1,...,"data":{}   +  newline  +  "x":1}   : one object once the newline is a comma
    damaged = head[:-1] + b'\n"x":1}\n' + lines[1] + b"," + lines[2] + b"\n"
    path.write_bytes(damaged)

    with pytest.raises(CorruptStateError, match=r"line 1 of .*entries\.jsonl"):
        store.read("s1")
    with pytest.raises(CorruptStateError, match=r"line 1 of .*entries\.jsonl"):
        FileStore(tmp_path / "store").load("s1")
