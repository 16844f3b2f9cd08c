"""The ``alpineagents`` command with any store: what it asks of a store beyond the contract.

Stores registered through the ``alpineagents.stores`` entry points as a plugin registers them
(a dist-info folder on ``sys.path``), next to FileStore:

* ``ls`` asks a store whose ``list`` takes ``limit=`` for the newest States only, slices the
  list of one that does not, and shows a screenful on a terminal (everything in a pipe);
* ``rm --purge`` for a store whose ``delete`` takes ``purge=``, a usage error otherwise; ``rm``
  prints what each delete reports;
* ``doctor`` prints a store's own checks (duck-typed), exit status 1 if one failed;
* a store's ``ValueError`` for its URL is a usage error (exit status 2);
* user info of a URL (``KEY:SECRET@``) appears in no error, traceback or store name printed.
"""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from alpineagents import FileStore, SavedState, State, Store
from alpineagents._cli import commands
from alpineagents.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from alpineagents.store import Record
from tests.helpers import MemoryStore, Terminal, make_states

SECRET = "s3cr3t/Key+vAlue"
KEY = "AKIAEXAMPLE"


# Stores of plugins ------------------------------------------------------------------------------


class Shared(MemoryStore):
    """A MemoryStore per URL, kept between commands (each opens its store anew)."""

    places: ClassVar[dict[str, dict[str, Any]]] = {}

    def __init__(self, url: str):
        super().__init__()
        self.url = url
        self._states = self.places.setdefault(url, {})

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Shared:
        return cls(url)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class Limited(Shared):
    """``list(limit=)``: records what it was asked for."""

    asked: ClassVar[list[int | None]] = []

    def list(self, *, limit: int | None = None) -> builtins.list[SavedState]:
        self.asked.append(limit)
        listed = MemoryStore.list(self)
        return listed if limit is None else listed[:limit]


class Plain(Shared):
    """The contract only: no limit, no purge, no doctor."""

    asked: ClassVar[int] = 0

    def list(self) -> builtins.list[SavedState]:
        type(self).asked += 1
        return MemoryStore.list(self)


@dataclass(frozen=True)
class Erased:
    state_id: str
    versions: int

    def __str__(self) -> str:
        return f"erased {self.state_id}: {self.versions} versions"


class Purging(Shared):
    """``delete(purge=)`` returning a report."""

    def delete(self, state_id: str, *, purge: bool = False) -> Erased | None:  # type: ignore[override]
        MemoryStore.delete(self, state_id)
        return Erased(state_id, 3) if purge else None


class AsyncPurging(Store):
    """An async-only store whose ``adelete`` takes ``purge=``."""

    def __init__(self, url: str):
        self.inner = Purging(url)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> AsyncPurging:
        return cls(url)

    async def awrite(
        self,
        state_id: str,
        entries: Sequence[dict[str, Any]],
        snapshot: dict[str, Any] | None,
        *,
        create: bool = False,
    ) -> None:
        self.inner.write(state_id, entries, snapshot, create=create)

    async def aread(self, state_id: str) -> Record | None:
        return self.inner.read(state_id)

    async def alist(self) -> builtins.list[SavedState]:
        return self.inner.list()

    async def adelete(self, state_id: str, *, purge: bool = False) -> Erased | None:  # type: ignore[override]
        return self.inner.delete(state_id, purge=purge)

    async def doctor(self) -> list[Any]:
        return [Finding("reachable", True, "answered")]


@dataclass(frozen=True)
class Finding:
    """A check of a plugin's own: the CLI reads name, ok and detail, nothing else."""

    name: str
    ok: bool
    detail: str


class Doctored(Shared):
    verdicts: ClassVar[list[bool]] = [True, True]

    def doctor(self) -> list[Finding]:
        return [
            Finding(f"check {n}", ok, f"detail {n} of {self.url}")
            for n, ok in enumerate(self.verdicts)
        ]


class Picky(Shared):
    """Refuses a prefix with a ``..`` segment, as S3Store does."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Picky:
        prefix = url.split("://", 1)[1].split("/", 1)[1]
        if ".." in prefix.split("/") or "//" in prefix:
            raise ValueError(f"the prefix {prefix!r} has a '..' segment or an empty folder name")
        return cls(url)


class PickyLater(Shared):
    """Takes any URL, but its list refuses it (a ValueError from a method, not from_url)."""

    def list(self) -> builtins.list[SavedState]:
        raise ValueError(f"{self.url} names no place this store can list")


class Leaky(Shared):
    """Says its endpoint, user info and all, in its repr and its errors (as botocore does)."""

    failure: ClassVar[type[Exception]] = OSError

    def __repr__(self) -> str:
        return f"Leaky(endpoint_url='http://{KEY}:{SECRET}@127.0.0.1:9')"

    def list(self) -> builtins.list[SavedState]:
        raise self.failure(
            f'Could not connect to the endpoint URL: "http://{KEY}:{SECRET}@127.0.0.1:9/"'
        )


@pytest.fixture(autouse=True)
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Register this module's stores by scheme, as an installed plugin would."""
    Shared.places.clear()
    Limited.asked.clear()
    Plain.asked = 0
    info = tmp_path / "plugins" / "teststores-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: teststores\nVersion: 0\n")
    schemes = {
        "limited": Limited,
        "plain": Plain,
        "purging": Purging,
        "apurging": AsyncPurging,
        "doctored": Doctored,
        "picky": Picky,
        "pickylater": PickyLater,
        "leaky": Leaky,
    }
    lines = [f"{scheme} = {__name__}:{cls.__name__}" for scheme, cls in schemes.items()]
    (info / "entry_points.txt").write_text("[alpineagents.stores]\n" + "\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))


def fill(url: str, count: int) -> None:
    from alpineagents import open_store

    store = open_store(url)
    target = store.inner if isinstance(store, AsyncPurging) else store
    make_states(target, count)


def on_a_terminal(monkeypatch: pytest.MonkeyPatch, lines: int) -> None:
    monkeypatch.setattr(commands, "_on_terminal", lambda stream: True)
    monkeypatch.setattr(commands, "_terminal_size", lambda: os.terminal_size((120, lines)))


# ls -------------------------------------------------------------------------------------------


def test_ls_asks_a_store_that_takes_a_limit_for_the_newest_only(cli: Any) -> None:
    fill("limited://a", 5)
    run = cli("ls", "limited://a", "--limit", "2")
    assert run.status == EXIT_OK, run.err
    assert [line.split()[0] for line in run.out.splitlines()[1:]] == ["run-4", "run-3"]
    assert Limited.asked == [2]
    # Filters apply before the limit: the store lists all.
    assert cli("ls", "limited://a", "--limit", "2", "--stopped-by", "finish").status == EXIT_OK
    assert Limited.asked == [2, None]


def test_ls_slices_the_list_of_a_store_without_a_limit(cli: Any) -> None:
    fill("plain://a", 5)
    run = cli("ls", "plain://a", "--limit", "2", "--json")
    assert run.status == EXIT_OK, run.err
    assert '"run-4"' in run.out and '"run-3"' in run.out and '"run-2"' not in run.out
    assert Plain.asked == 1


@pytest.mark.parametrize("scheme", ["limited", "plain", "folder"])
def test_ls_on_a_terminal_shows_a_screenful_and_says_there_is_more(
    cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, scheme: str
) -> None:
    url = str(tmp_path / "runs") if scheme == "folder" else f"{scheme}://a"
    if scheme == "folder":
        make_states(FileStore(url), 30)
    else:
        fill(url, 30)
    piped = cli("ls", url)
    assert len(piped.out.splitlines()) == 31 and piped.err == ""  # a pipe gets everything

    on_a_terminal(monkeypatch, lines=15)
    run = cli("ls", url)
    rows = run.out.splitlines()[1:]
    assert [row.split()[0] for row in rows] == [f"run-{n}" for n in range(29, 17, -1)]  # 12
    assert "the 12 most recently updated; there are more: --all" in run.err
    if scheme == "limited":
        assert Limited.asked[-1] == 13  # one more than shown: is there more?
    everything = cli("ls", url, "--all")
    assert len(everything.out.splitlines()) == 31 and everything.err == ""
    assert len(cli("ls", url, "--limit", "20").out.splitlines()) == 21
    assert cli("ls", url, "--json").out.count('"id"') == 30
    assert cli("ls", url, "--all", "--limit", "3").status == EXIT_USAGE


def test_ls_on_a_terminal_with_no_more_than_a_screenful_says_nothing_more(
    cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill("limited://a", 12)
    on_a_terminal(monkeypatch, lines=15)
    run = cli("ls", "limited://a")
    assert len(run.out.splitlines()) == 13 and run.err == ""


# rm --purge -----------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["purging", "apurging"])
def test_rm_purge_prints_what_each_delete_reports(cli: Any, scheme: str) -> None:
    url = f"{scheme}://a"
    fill(url, 3)
    run = cli("rm", "--purge", "--yes", url, "run-0", "run-2")
    assert run.status == EXIT_OK, run.err
    assert run.out == "erased run-0: 3 versions\nerased run-2: 3 versions\n"
    run = cli("rm", "--yes", url, "run-1")  # without --purge: None, so its own line
    assert run.out == "removed run-1\n"


def test_rm_purge_of_a_store_that_cannot_purge_is_a_usage_error(cli: Any) -> None:
    fill("plain://a", 2)
    run = cli("rm", "--purge", "--yes", "plain://a", "run-0")
    assert run.status == EXIT_USAGE
    assert "cannot purge: its delete() takes no purge=" in run.err
    assert [s["id"] for s in json.loads(cli("ls", "plain://a", "--json").out)] == [
        "run-1",
        "run-0",
    ]


def test_rm_purge_asks_first_on_a_terminal(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "runs"
    make_states(FileStore(folder), 2)
    (folder / ".run-0.0123456789ab.deleted").mkdir()  # a killed delete's leftover
    (folder / ".run-0.0123456789ab.deleted" / "entries.jsonl").write_text("{}\n")
    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    run = cli("rm", "--purge", str(folder), "run-0")
    assert run.status == EXIT_USAGE and "Purge 1 State(s)" in run.err
    assert "(every version and leftover)" in run.err and "nothing removed" in run.err
    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    run = cli("rm", "--purge", str(folder), "run-0")
    assert run.status == EXIT_OK
    assert run.out == "purged State 'run-0': 3 files, 1 leftover folder\n"
    assert sorted(os.listdir(folder)) == ["run-1"]


# doctor ---------------------------------------------------------------------------------------


def test_doctor_prints_each_check_and_fails_when_one_does(cli: Any) -> None:
    run = cli("doctor", "doctored://a")
    assert run.status == EXIT_OK
    assert run.out.splitlines() == [
        "ok      check 0: detail 0 of doctored://a",
        "ok      check 1: detail 1 of doctored://a",
    ]
    Doctored.verdicts = [True, False]
    try:
        run = cli("doctor", "doctored://a")
    finally:
        Doctored.verdicts = [True, True]
    assert run.status == EXIT_FAILURE
    assert run.out.splitlines()[1] == "FAILED  check 1: detail 1 of doctored://a"
    assert "1 of 2 check(s) failed" in run.err


def test_doctor_of_a_store_without_checks_says_so(cli: Any) -> None:
    run = cli("doctor", "plain://a")
    assert run.status == EXIT_OK
    assert run.out == "Plain('plain://a') has no checks: it has no doctor()\n"


def test_doctor_of_an_async_store_awaits_its_checks(cli: Any) -> None:
    run = cli("doctor", "apurging://a")
    assert run.status == EXIT_OK and run.out == "ok      reachable: answered\n"


def test_doctor_of_a_folder(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "place").mkdir()
    run = cli("doctor", str(tmp_path / "place" / "not-yet"))
    assert run.status == EXIT_OK, run.out
    assert [line.split()[:2] for line in run.out.splitlines()] == [
        ["ok", "folder:"],
        ["ok", "writable:"],
        ["ok", "modes:"],
        ["ok", "locks:"],
    ]
    assert os.listdir(tmp_path / "place") == []


# Bad URLs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("picky://bucket/b/../", "has a '..' segment"),
        ("picky://bucket/a//b", "empty folder name"),
        ("pickylater://bucket/x", "names no place this store can list"),
        ("", "no store given"),
        ("file://", "no store given"),
        ("a\0b", "holds a NUL character"),
    ],
)
def test_a_url_a_store_refuses_is_a_usage_error(cli: Any, url: str, words: str) -> None:
    run = cli("ls", url)
    assert run.status == EXIT_USAGE, (run.out, run.err)
    assert run.out == ""
    assert run.err.startswith("alpineagents: error: ") and words in run.err
    assert "Traceback" not in run.err


def test_a_good_url_of_the_picky_store_still_lists(cli: Any) -> None:
    fill("picky://bucket/b/", 1)
    assert cli("ls", "picky://bucket/b/").status == EXIT_OK


# Secrets --------------------------------------------------------------------------------------


def test_user_info_appears_in_no_error_name_or_traceback(
    cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"leaky://{KEY}:{SECRET}@host/runs"
    outputs = []
    run = cli("ls", url)  # an OSError naming the endpoint: one line
    assert run.status == EXIT_FAILURE and "Could not connect" in run.err
    assert "http://***@127.0.0.1:9" in run.err
    outputs.append(run.out + run.err)
    run = cli("rm", "--yes", url, "x")  # the store's repr in a message
    outputs.append(run.out + run.err)
    run = cli("ls", url, "--limit", f"http://{KEY}:{SECRET}@x")  # argparse echoes the value
    assert run.status == EXIT_USAGE
    outputs.append(run.out + run.err)
    run = cli("show", url, "bad id!")  # an invalid id, with the URL in the hint
    outputs.append(run.out + run.err)
    run = cli("rm", "--purge", "--yes", url, "x")  # cannot purge: the store's repr
    assert run.status == EXIT_USAGE and "Leaky(endpoint_url='http://***@127.0.0.1:9')" in run.err
    outputs.append(run.out + run.err)
    monkeypatch.setenv("ALPINEAGENTS_DEBUG", "1")
    run = cli("ls", url)  # the traceback of an expected failure
    assert "Traceback (most recent call last)" in run.err and "OSError" in run.err
    outputs.append(run.out + run.err)
    monkeypatch.delenv("ALPINEAGENTS_DEBUG")
    monkeypatch.setattr(Leaky, "failure", RuntimeError)
    run = cli("ls", url)  # an unexpected exception: a traceback, exit status 1
    assert run.status == EXIT_FAILURE and "RuntimeError" in run.err
    outputs.append(run.out + run.err)
    for text in outputs:
        assert SECRET not in text and KEY not in text, text
        assert "s3cr3t" not in text, text


def test_the_picky_store_error_of_a_url_with_user_info_hides_it(cli: Any) -> None:
    run = cli("ls", f"picky://{KEY}:{SECRET}@bucket/b/../")
    assert run.status == EXIT_USAGE
    assert SECRET not in run.err and KEY not in run.err
    assert "picky://***@bucket" in run.err


def test_a_store_created_for_the_tests_round_trips(cli: Any) -> None:
    # The registered stores are real stores: a State saved through one loads back.
    from alpineagents import open_store

    store = open_store("plain://z")
    store.save(State("kept", id="k"))
    assert open_store("plain://z").load("k").task == "kept"
