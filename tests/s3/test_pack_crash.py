"""``S3Store.pack`` killed with SIGKILL at every request it makes, in a real process.

A child process (tests/s3/_pack_child.py) forks one process per pack; that process packs a
State on moto's server (over HTTP, the server runs in this process) and kills itself with
SIGKILL before its k-th request is sent, for every k from the first request of the pack to the
last (a pack that is not killed is counted first), and once the answer to its last request came
back. What S3 holds after a kill is what the requests sent before it did, so those kills reach
every state a kill can leave; a kill once the k-th answer came back, for k before the last, is
the kill before the next request as far as S3 can tell.

After every kill, the State must be as it was before the pack: the same entries and snapshot
through ``read`` and ``load``. A new pack then completes and leaves exactly one chain of
segments (whatever the killed pack wrote or left half removed), the State still reads the same,
a save on top of it works, and ``sweep`` finds nothing abandoned.

Cases: a first pack, with entries kept (``pack``), and of a State that makes two segments with
entries removed (``apack``; two tool results of ~1.1 MB: 5 entries, so the pack makes 13
requests rather than one GET per entry of ~20 KB), and of one over four times
``SEGMENT_MAX`` (five such results, 11 entries), cut at a quarter into three segments, entries
removed (``pack``); a second pack that merges the small segment
of an earlier pack into a new one (a kill lands between "new segment written" and "merged
segment removed"), with entries removed (``pack``) and kept (``apack``); and a load through
``S3Store(auto_pack=1)`` (``load`` and ``aload``), which packs what it read, killed at any of
its reads or of its pack's writes. Each kill point costs a pack in a forked process and about
60 requests of checks: ~0.7 s.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest

from alpineagents import State
from alpineagents._serialize import entry_to_dict
from alpineagents_s3 import S3Store
from tests.helpers import MakeBucket, Mode
from tests.s3.helpers import run

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client

pytestmark = [pytest.mark.slow, pytest.mark.crash]

ROOT = Path(__file__).resolve().parents[2]
# One of these tool results is more than a segment holds (SEGMENT_MAX, 1 MiB).
BIG = "row,value\n" + "alpha,1\nbeta,2\ngamma,3\n" * 46_000


@dataclass(frozen=True)
class Case:
    """One pack to kill at every request.

    Attributes:
        remove_entries: The pack's ``remove_entries``.
        mode: ``pack`` (sync) or ``apack`` (async), in the killed process.
        merge: The State was packed before (a small segment), then saved on: the pack merges.
        large: The State is ~2.2 MB: the pack writes two segments (else one, of ~5 KB).
        huge: The State is ~5.3 MB, more than four times ``SEGMENT_MAX``: the pack cuts it
            at a quarter (two ~1.1 MB tool results a segment), three segments, not five.
        on_load: The pack of a load through ``S3Store(auto_pack=1)`` (entries kept).
    """

    remove_entries: bool
    mode: Mode
    merge: bool
    large: bool = False
    huge: bool = False
    on_load: bool = False

    @property
    def segments(self) -> int:
        """How many segments the pack writes."""
        return 3 if self.huge else 2 if self.large else 1

    @property
    def name(self) -> str:
        kept = "removed" if self.remove_entries else "kept"
        size = "-huge" if self.huge else "-large" if self.large else ""
        how = "on-load-" if self.on_load else ""
        return f"{how}{'merge' if self.merge else 'first'}{size}-{kept}-{self.mode}"


CASES = [
    Case(remove_entries=False, mode="sync", merge=False),
    Case(remove_entries=True, mode="async", merge=False, large=True),
    Case(remove_entries=True, mode="sync", merge=False, huge=True),
    Case(remove_entries=True, mode="sync", merge=True),
    Case(remove_entries=False, mode="async", merge=True),
    Case(remove_entries=False, mode="sync", merge=False, on_load=True),
    Case(remove_entries=False, mode="async", merge=True, on_load=True),
]


class Packer:
    """The child process: packs a State in a forked process, killed at a request or not."""

    def __init__(self, endpoint: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.s3._pack_child", endpoint],
            cwd=ROOT,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.process.stdout is not None and self.process.stdin is not None
        self.stdin, self.stdout = self.process.stdin, self.process.stdout
        assert self.stdout.readline().strip() == "ready"

    def pack(
        self, store: S3Store, state_id: str, case: Case, kill: tuple[str, int] | None = None
    ) -> dict[str, Any]:
        """Pack ``state_id`` of ``store``'s bucket and prefix; how the process ended."""
        job = {
            "bucket": store.bucket,
            "prefix": store.prefix,
            "id": state_id,
            "remove_entries": case.remove_entries,
            "mode": case.mode,
            "on_load": case.on_load,
            "kill": {"event": kill[0], "at": kill[1]} if kill else None,
        }
        self.stdin.write(json.dumps(job) + "\n")
        self.stdin.flush()
        line = self.stdout.readline()
        assert line, f"the child process ended (exit {self.process.poll()})"
        report: dict[str, Any] = json.loads(line)
        return report

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(timeout=30)
        self.stdout.close()


@pytest.fixture(scope="module")
def packer(moto_url: str) -> Iterator[Packer]:
    made = Packer(moto_url)
    try:
        yield made
    finally:
        made.close()


def prepare(store: S3Store, state_id: str, case: Case) -> State:
    """Save the State the pack starts from (packed once already, for a merge)."""
    state = State(f"pack {case.name}", id=state_id, data={"case": case.name})
    if case.huge:
        run(state, 5, result=BIG)  # 11 entries, ~5.3 MB: three segments
    elif case.large:
        run(state, 2, result=BIG)  # 5 entries, ~2.2 MB: two segments
    elif case.merge:
        run(state, 1)  # 3 entries, ~2 KB: one small segment
        store.save(state)
        store.pack(state_id, remove_entries=case.remove_entries)
        run(state, 1, first=1)
    else:
        run(state, 2)  # 5 entries, ~5 KB: one segment
    store.save(state)
    return state


def entries_of(state: State) -> list[dict[str, Any]]:
    return [entry_to_dict(e) for e in state.history]


def snapshot_of(client: S3Client, store: S3Store, state_id: str) -> tuple[bytes, str]:
    """The snapshot object's bytes and ETag, read behind the store's back."""
    got = client.get_object(Bucket=store.bucket, Key=f"{store.prefix}{state_id}/snapshot.json")
    return got["Body"].read(), got["ETag"]


def segment_range(key: str) -> tuple[int, int]:
    """``(start, end)`` of a segment key ``.../packed/<generation>/<start>-<end>.json``."""
    start, end = key.rsplit("/", 1)[1].removesuffix(".json").split("-")
    return int(start), int(end)


def check_after_kill(
    store: S3Store,
    reader: S3Store,
    state_id: str,
    case: Case,
    before: tuple[State, bytes],
    where: str,
) -> None:
    """What must hold of a State whose pack was killed; ``where`` names the kill point.

    ``before`` is the State as saved and its snapshot object's body, from before the pack.
    ``store`` saved the State, ``reader`` is another store object (another process, as far
    as S3 can tell).
    """
    state, snapshot = before
    count = len(state.history)
    record = reader.read(state_id)
    assert record is not None, where
    assert sorted(record.entries, key=lambda e: e["seq"]) == entries_of(state), where
    assert record.snapshot == json.loads(snapshot), where

    packed = reader.pack(state_id, remove_entries=case.remove_entries)
    assert packed.covered == count, where
    continued = reader.load(state_id)
    assert entries_of(continued) == entries_of(state), where

    # The run goes on: a save on top of the packed State, read back by another store object.
    run(continued, 1, first=100, result="after the pack")
    continued.add_user_message("saved on top")
    reader.save(continued)
    assert entries_of(store.load(state_id)) == entries_of(continued), where
    assert reader.sweep(older_than=0) == [], where

    found = reader.objects(state_id)
    assert {o.kind for o in found} <= {"snapshot", "entry", "segment"}, (where, found)
    # One chain of segments from seq 0 to the count: nothing the killed pack wrote, or was
    # about to remove, is left beside it.
    chain = sorted(segment_range(o.key) for o in found if o.kind == "segment")
    assert chain[0][0] == 0 and chain[-1][1] == count, (where, chain)
    assert all(a[1] == b[0] for a, b in pairwise(chain)), (where, chain)
    entries = sorted(o.seq for o in found if o.kind == "entry" and o.seq is not None)
    packed_entries = [] if case.remove_entries else list(range(count))
    assert entries == [*packed_entries, *range(count, len(continued.history))], where


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_a_pack_killed_at_any_request_leaves_the_state_as_it_was(
    case: Case, packer: Packer, moto_url: str, moto: S3Client, moto_bucket: MakeBucket
) -> None:
    bucket = moto_bucket()
    session = boto3.Session()
    store = S3Store(bucket, case.name, endpoint_url=moto_url, session=session)
    reader = S3Store(bucket, case.name, endpoint_url=moto_url, session=session)
    with store, reader:
        # The pack not killed: how many requests it makes, and which.
        entries = len(prepare(store, "counted", case).history)
        done = packer.pack(store, "counted", case)
        assert done["exit"] == 0 and "error" not in done, done
        if case.on_load:
            assert done["loaded"] == 5, done
            segments = [o.key for o in store.objects("counted") if o.kind == "segment"]
            assert [segment_range(key) for key in segments] == [(0, 5)], segments
        else:
            assert done["packed"]["covered"] == entries, done
        operations = [op for op, _ in done["before"]]
        # No retries: one answer came back per request sent.
        assert Counter(op for op, _ in done["after"]) == Counter(operations), done
        assert operations.count("PutObject") == case.segments, operations
        assert "HeadObject" in operations, operations
        assert ("DeleteObjects" in operations) == (case.merge or case.remove_entries)
        store.delete("counted")
        total = len(operations)

        kills = 0
        points = [("before-send", k) for k in range(1, total + 1)] + [("after-call", total)]
        for event, k in points:
            state_id = f"{event}-{k}"
            state = prepare(store, state_id, case)
            snapshot = snapshot_of(moto, store, state_id)
            killed = packer.pack(store, state_id, case, kill=(event, k))
            where = f"{case.name}: killed at {event} of request {k} of {total}"
            assert killed["signal"] == signal.SIGKILL, (where, killed)
            assert killed[event.split("-")[0]][-1][1] == k, (where, killed)
            # A pack never writes the snapshot.
            assert snapshot_of(moto, store, state_id) == snapshot, where
            check_after_kill(store, reader, state_id, case, (state, snapshot[0]), where)
            store.delete(state_id)
            kills += 1
        assert kills == total + 1
