"""Real processes: killed with SIGKILL mid-save, and racing to create one id."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from alpineagents.history import COMPACTION, MODEL, NOTICE, TASK, TOOL_RESULT, USER
from alpineagents_s3 import S3Store
from alpineagents_s3.testing import separate_process
from tests.helpers import MakeBucket, Mode, results
from tests.scripts import harness

ROOT = Path(__file__).resolve().parents[2]


def child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.s3._child", *args],
        cwd=ROOT,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def run_child(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.s3._child", *args],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=60,
    )


@pytest.mark.slow
@pytest.mark.crash
def test_killed_between_entry_puts_and_head_put_the_save_did_not_happen(
    mode: Mode, moto_url: str, moto_bucket: MakeBucket
) -> None:
    bucket = moto_bucket()
    done = run_child("crash-before-head", moto_url, bucket, "killed", mode)
    assert done.returncode == -signal.SIGKILL, done.stderr

    with separate_process(S3Store(bucket, "runs", endpoint_url=moto_url)) as store:
        objects = store.objects("killed")
        # The head names the create's entry; the killed save's three entries are named by no
        # head: its save never returned, so nothing saved is lost, and none of it is read.
        assert [o.role for o in objects] == ["head", "entry"] + ["unnamed"] * 3
        state = store.load("killed")
        assert [e.kind for e in state.history] == [TASK]
        state.add_user_message("resumed")  # the resumed State saves on, beside them
        assert store.save(state) is True
        again = separate_process(S3Store(bucket, "runs", endpoint_url=moto_url)).load("killed")
        assert [(e.kind, e.text) for e in again.history[1:]] == [(USER, "resumed")]
        state.add_user_message("and on")
        assert store.save(state) is True
        again = separate_process(S3Store(bucket, "runs", endpoint_url=moto_url)).load("killed")
        assert [e.text for e in again.history[1:]] == ["resumed", "and on"]
        assert len(store.sweep(0)) == 3  # what the killed save left, removed


@pytest.mark.slow
@pytest.mark.crash
def test_killed_after_a_tool_result_saved_alone_keeps_it(
    moto_url: str, moto_bucket: MakeBucket
) -> None:
    bucket = moto_bucket()
    done = run_child("crash-after-tool-result", moto_url, bucket, "tools")
    assert done.returncode == -signal.SIGKILL, done.stderr

    with S3Store(bucket, "runs", endpoint_url=moto_url) as store:
        state = store.load("tools")
    # The fast result was saved while the slow tool ran; loading gives the slow call a result
    # that says it is unknown.
    found = [e.as_tool_result() for e in state.history if e.kind == TOOL_RESULT]
    assert [(r.call_id, r.unknown) for r in found] == [("fast", False), ("slow", True)]
    assert results(state)[0][1] == "fast result"
    assert results(state)[1][1].startswith("(unknown: the run stopped before this result")


@pytest.mark.slow
@pytest.mark.integration
def test_processes_creating_one_id_at_once_have_one_winner(
    localstack_url: str, localstack_bucket: MakeBucket
) -> None:
    bucket = localstack_bucket()
    writers = [child("race", localstack_url, bucket, str(n)) for n in range(4)]
    rounds = 10
    try:
        for writer in writers:
            assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        outcomes: dict[str, list[str]] = {}
        for round_ in range(rounds):
            state_id = f"race-{round_}"
            for writer in writers:  # as close together as pipes allow
                assert writer.stdin is not None
                writer.stdin.write(f"go {state_id}\n")
                writer.stdin.flush()
            outcomes[state_id] = [
                w.stdout.readline().strip() for w in writers if w.stdout is not None
            ]
    finally:
        for writer in writers:
            assert writer.stdin is not None and writer.stdout is not None
            writer.stdin.close()
            writer.wait(timeout=30)
            writer.stdout.close()

    with S3Store(bucket, "runs", endpoint_url=localstack_url) as store:
        for state_id, lines in outcomes.items():
            won = [n for n, line in enumerate(lines) if line == f"won {state_id}"]
            assert len(won) == 1, lines
            assert all(
                line == f"lost {state_id} StateExistsError"
                for line in lines
                if not line.startswith("won")
            ), lines
            assert store.load(state_id).task == f"writer {won[0]}"
            # The losers left nothing behind: they deleted their entries.
            assert [o.role for o in store.objects(state_id)] == ["head", "entry"]
        assert len(store.list()) == rounds


@pytest.mark.slow
@pytest.mark.crash
def test_killed_mid_compaction_the_pending_message_stays_after_the_next_summary(
    mode: Mode, bucket: str, moto_url: str, tmp_path: Path
) -> None:
    # tests/test_crash.py runs the same child on a FileStore; here s3:// reaches moto
    # through AWS_ENDPOINT_URL_S3 (the bucket fixture sets it).
    args = (f"s3://{bucket}/runs", "pending", tmp_path, "run" if mode == "sync" else "arun")
    with harness.child("compaction_child.py", *args, "pending") as proc:
        code, _, err = harness.ended(proc)  # the store kills its own process
    assert code == -signal.SIGKILL, err

    resumed = harness.run_child("compaction_child.py", *args, "pending", "--resume")

    assert harness.answer_of(resumed) == "ANSWER-resumed"
    step = harness.logged_requests(tmp_path, "resumed")[-1]
    blocks = [b["text"] for m in step["messages"] for b in m["content"]]
    assert blocks[0].endswith("SUMMARY-resumed")
    assert blocks[1] == "PENDING: what did the note say?"
    with S3Store(bucket, "runs", endpoint_url=moto_url) as store:
        state = store.load("pending")
    kinds = [e.kind for e in state.history]
    assert kinds == [TASK, MODEL, USER, COMPACTION, NOTICE, COMPACTION, MODEL]
    assert state.history[5].as_compaction().covers == 1
