"""examples/ run as a user runs them: real processes, the offline model, moto's HTTP server."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from alpineagents import FileStore, State, Store
from alpineagents.history import MODEL, TASK, USER
from alpineagents.testing import FunctionModel, TestModel, call
from alpineagents.transfer import copy_states, export_state
from alpineagents_s3 import S3Store
from tests._docs_support import ROOT, keys, new_bucket, offline_env, run
from tests.helpers import AWS_ENV, moto_server

EXAMPLES = ROOT / "examples"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy credentials for the S3Store objects this process opens."""
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)


def example(name: str, *args: str) -> list[str]:
    return [sys.executable, str(EXAMPLES / name), *args]


def conversation(state: State) -> list[tuple[str, str]]:
    return [(e.kind, e.text) for e in state.history]


def test_every_example_says_how_to_run_it() -> None:
    programs = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert {"archive.py", "chat_loop.py", "shared_bucket.py"} <= set(programs)
    for name in programs:
        source = (EXAMPLES / name).read_text()
        assert source.startswith('"""'), name
        assert f"python examples/{name}" in source.split('"""')[1], name


# chat_loop.py ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["folder", "s3"])
def test_chat_loop_resumes_across_processes(
    kind: str, tmp_path: Path, moto_url: str, aws: None
) -> None:
    if kind == "folder":
        url = str(tmp_path / "agent-runs")
        store: Store = FileStore(url)
    else:
        bucket = new_bucket(moto_url, "chat")
        url = f"s3://{bucket}/chats"
        store = S3Store(bucket, "chats", endpoint_url=moto_url)
    env = offline_env(moto_url)

    # --resume on an empty store: no IndexError, a new conversation.
    first = run(example("chat_loop.py", url, "--resume"), env, tmp_path, stdin="hello\nand two\n")
    assert "nothing to resume: starting a new conversation" in first.stdout
    assert "You said: hello" in first.stdout
    assert "You said: and two" in first.stdout
    (saved,) = store.list()

    # A new process continues the same conversation.
    second = run(example("chat_loop.py", url, "--resume"), env, tmp_path, stdin="three\n")
    assert f"resuming {saved.id}: 'hello'" in second.stdout
    assert "You said: three" in second.stdout
    state = store.load(saved.id)
    assert conversation(state) == [
        (TASK, "hello"),
        (MODEL, "You said: hello"),
        (USER, "and two"),
        (MODEL, "You said: and two"),
        (USER, "three"),
        (MODEL, "You said: three"),
    ]
    assert state.stopped_by == "reply"
    if kind == "s3":
        assert f"chats/heads/{saved.id}.json" in keys(moto_url, bucket)
    store.close()


def test_chat_loop_without_resume_starts_a_second_conversation(
    tmp_path: Path, moto_url: str
) -> None:
    url = str(tmp_path / "runs")
    env = offline_env(moto_url)
    run(example("chat_loop.py", url), env, tmp_path, stdin="first\n")
    run(example("chat_loop.py", url), env, tmp_path, stdin="second\n")
    assert sorted(s.task for s in FileStore(url).list()) == ["first", "second"]


# shared_bucket.py -----------------------------------------------------------------------


def test_shared_bucket_refused_writer_reloads_and_continues(
    tmp_path: Path, moto_url: str, aws: None
) -> None:
    bucket = new_bucket(moto_url, "shared")
    url = f"s3://{bucket}/shared"
    env = offline_env(moto_url)

    run(example("shared_bucket.py", url, "notes", "--message", "hello"), env, tmp_path)

    # Process A loads the conversation and waits for its message ...
    a = subprocess.Popen(
        example("shared_bucket.py", url, "notes"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
        text=True,
    )
    try:
        assert a.stdout is not None and a.stdin is not None
        assert a.stdout.readline().strip() == "loaded notes: 2 entries"
        # ... while process B, on another machine, takes a turn.
        b = run(example("shared_bucket.py", url, "notes", "--message", "from B"), env, tmp_path)
        assert "Noted: from B" in b.stdout
        assert "refused" not in b.stdout
        out, err = a.communicate("from A\n", timeout=120)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert a.returncode == 0, f"{out}\n{err}"
    # The prompt "> " of input() may come first on a line of output.
    lines = [line.removeprefix("> ") for line in out.splitlines()]
    # A's save is refused instead of overwriting B's turn; A reloads and runs again.
    assert any(line.startswith("refused (ConcurrentWriteError): ") for line in lines), out
    assert "reloaded notes: 4 entries" in lines, out
    assert lines[-1] == "Noted: from A"

    with S3Store(bucket, "shared", endpoint_url=moto_url) as store:
        state = store.load("notes")
    assert conversation(state) == [
        (TASK, "hello"),
        (MODEL, "Noted: hello"),
        (USER, "from B"),
        (MODEL, "Noted: from B"),
        (USER, "from A"),
        (MODEL, "Noted: from A"),
    ]


# archive.py -----------------------------------------------------------------------------


def fill(store: Store) -> None:
    """Two finished States, one waiting on a question, one never run to its end."""
    from alpineagents import Agent

    Agent(FunctionModel(lambda r: "Done."), store=store).run(State("reply me", id="replied"))
    Agent(TestModel(answer="ok"), store=store).run(State("finish me", id="finished"))

    def asks(request: object) -> list[dict[str, object]]:
        return [call("ask", question="Which city?")]

    Agent(FunctionModel(asks), store=store).run(State("ask me", id="asking"))
    store.save(State("still running", id="running"))


def test_archive_moves_only_finished_states_and_is_idempotent(
    tmp_path: Path, moto_url: str, aws: None
) -> None:
    bucket = new_bucket(moto_url, "archive")
    live = S3Store(bucket, "live", endpoint_url=moto_url)
    cold = S3Store(bucket, "archive", endpoint_url=moto_url)
    fill(live)
    before = {i: export_state(live, i) for i in ("replied", "finished")}
    env = offline_env(moto_url)
    args = [f"s3://{bucket}/live", f"s3://{bucket}/archive"]

    young = run(example("archive.py", *args, "--older-than", "1h"), env, tmp_path)
    assert young.stdout.strip() == "nothing to archive"
    dry = run(example("archive.py", *args, "--older-than", "0s", "--dry-run"), env, tmp_path)
    assert sorted(dry.stdout.splitlines()) == [
        "would archive: finished",
        "would archive: replied",
    ]
    assert cold.list() == []

    # A run killed after copying "replied" but before removing it: the next run finishes it.
    copy_states(live, cold, ["replied"])
    moved = run(example("archive.py", *args, "--older-than", "0s"), env, tmp_path)
    assert "archived (identical): replied (2 entries)" in moved.stdout
    assert "archived: finished (" in moved.stdout
    assert moved.stdout.splitlines()[-1] == f"moved 2 State(s) to s3://{bucket}/archive"

    assert sorted(s.id for s in live.list()) == ["asking", "running"]
    assert sorted(s.id for s in cold.list()) == ["finished", "replied"]
    for state_id, exported in before.items():
        after = export_state(cold, state_id)
        assert (after["entries"], after["snapshot"]) == (exported["entries"], exported["snapshot"])
        assert not any(k.startswith(f"live/{state_id}/") for k in keys(moto_url, bucket))

    again = run(example("archive.py", *args, "--older-than", "0s"), env, tmp_path)
    assert again.stdout.strip() == "nothing to archive"
    assert sorted(s.id for s in cold.list()) == ["finished", "replied"]
    live.close()
    cold.close()


def test_archive_from_a_folder_into_a_bucket(tmp_path: Path, moto_url: str, aws: None) -> None:
    bucket = new_bucket(moto_url, "cold")
    folder = tmp_path / "agent-runs"
    fill(FileStore(folder))
    env = offline_env(moto_url)
    before = FileStore(folder).load("finished")
    moved = run(
        example("archive.py", str(folder), f"s3://{bucket}/2026", "--older-than", "0s"),
        env,
        tmp_path,
    )
    assert "archived: finished (" in moved.stdout
    assert sorted(s.id for s in FileStore(folder).list()) == ["asking", "running"]
    with S3Store(bucket, "2026", endpoint_url=moto_url) as cold:
        assert sorted(s.id for s in cold.list()) == ["finished", "replied"]
        after = cold.load("finished")
        assert after.answer == "ok" and after.history == before.history
        # Each State copied in one write: its head and its entries, nothing left over.
        for state_id in ("finished", "replied"):
            roles = {o.role for o in cold.objects(state_id)}
            assert roles <= {"head", "entry", "segment"} and "head" in roles


def test_archive_refuses_a_bad_age(tmp_path: Path, moto_url: str) -> None:
    done = subprocess.run(
        example("archive.py", str(tmp_path), str(tmp_path / "b"), "--older-than", "soon"),
        env=offline_env(moto_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "not an age: 'soon'" in done.stderr
