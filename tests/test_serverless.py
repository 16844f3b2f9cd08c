"""examples/serverless_handler.py, invoked as a function platform would, on S3 over HTTP.

moto's ThreadedMotoServer runs in this process; the handler reaches it through boto3 like a
real bucket. Warm: one process takes several events (the module's Agent and store are kept).
Cold: a new process per event. Each event is one ``asyncio.run``, as the handler does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import pytest

from alpineagents import open_store
from tests.helpers import AWS_ENV, moto_server
from tests.loopback_anthropic import loopback, message, text

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "serverless_handler.py"


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server, for this module's tests."""
    with moto_server() as url:
        yield url


@pytest.fixture
def env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The function's environment: a new bucket on moto, the offline model, no API key.

    Set in this process too (warm invocations read it) and passed to cold ones.
    """
    bucket = f"conversations-{uuid.uuid4().hex[:12]}"
    settings = {
        **AWS_ENV,
        "AWS_ENDPOINT_URL_S3": moto_endpoint,
        "RUNS_URL": f"s3://{bucket}/chats/",
        "MODEL": "offline",
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=bucket)
    return dict(os.environ)


@pytest.fixture
def warm(env: dict[str, str]) -> ModuleType:
    """The handler module freshly imported in this process: a new warm instance."""
    spec = importlib.util.spec_from_file_location("serverless_handler", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cold(event: dict[str, Any], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One event in a new process, as a cold start runs it."""
    code = (
        "import json, sys\n"
        "from serverless_handler import handler\n"
        "print(json.dumps(handler(json.loads(sys.argv[1]), None)))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, json.dumps(event)],
        env={**env, "PYTHONPATH": os.pathsep.join([str(EXAMPLE.parent), str(REPO)])},
        capture_output=True,
        text=True,
        timeout=120,
    )


def cold_ok(event: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    done = cold(event, env)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def history(env: dict[str, str], conversation_id: str) -> list[tuple[str, str]]:
    """The conversation as the bucket has it: (kind, text) per entry."""
    with open_store(env["RUNS_URL"]) as store:
        return [(e.kind, e.text) for e in store.load(conversation_id).history]


def test_warm_events_start_and_continue_conversations(
    warm: ModuleType, env: dict[str, str]
) -> None:
    first = warm.handler({"conversation_id": "c-1", "message": "hello"}, None)
    assert first == {
        "conversation_id": "c-1",
        "stopped_by": "reply",
        "reply": "You said: hello. Which order is it about?",
    }
    agent = warm._agent
    second = warm.handler({"conversation_id": "c-1", "message": "It is order 42"}, None)
    assert second["reply"].startswith("Here is what I found. Order 42 left the warehouse")
    other = warm.handler({"conversation_id": "c-2", "message": "hi"}, None)
    assert other["reply"] == "You said: hi. Which order is it about?"
    assert warm._agent is agent  # the warm instance reused its Agent, store and clients
    kinds = [kind for kind, _ in history(env, "c-1")]
    assert kinds == ["task", "model", "user", "model", "tool_result", "model"]
    assert [kind for kind, _ in history(env, "c-2")] == ["task", "model"]


@pytest.mark.slow
def test_cold_events_each_in_a_new_process(env: dict[str, str]) -> None:
    assert cold_ok({"conversation_id": "c-9", "message": "hello"}, env)["stopped_by"] == "reply"
    reply = cold_ok({"conversation_id": "c-9", "message": "and order 7?"}, env)["reply"]
    assert reply.startswith("Here is what I found. Order 7 left the warehouse")
    assert [kind for kind, _ in history(env, "c-9")] == [
        *("task", "model", "user", "model", "tool_result", "model"),
    ]


@pytest.mark.slow
def test_the_example_runs_an_event_from_the_command_line(tmp_path: Path) -> None:
    """As its docstring shows: one event per call, a folder for the runs, the offline model."""
    env = {**os.environ, "RUNS_URL": str(tmp_path / "runs"), "MODEL": "offline"}
    env.pop("ANTHROPIC_API_KEY", None)
    replies = []
    for said in ("Where is order 42?", "Thanks"):
        event = json.dumps({"conversation_id": "cli-1", "message": said})
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), event],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=True,
        )
        replies.append(json.loads(done.stdout))
    assert replies[0]["reply"].startswith("Here is what I found. Order 42")
    assert replies[1] == {
        "conversation_id": "cli-1",
        "stopped_by": "reply",
        "reply": "You said: Thanks. Which order is it about?",
    }


@pytest.mark.slow
def test_a_conversation_stopped_by_max_steps_continues_without_a_message(
    env: dict[str, str],
) -> None:
    env = {**env, "MAX_STEPS": "1"}
    stopped = cold_ok({"conversation_id": "c-budget", "message": "where is order 5?"}, env)
    assert stopped == {"conversation_id": "c-budget", "stopped_by": "max_steps", "reply": None}
    resumed = cold_ok({"conversation_id": "c-budget"}, env)
    assert resumed["stopped_by"] == "reply"
    assert resumed["reply"].startswith("Here is what I found. Order 5")
    # Nothing was invented: the person's one message, the call, its result, the answer.
    assert [kind for kind, _ in history(env, "c-budget")] == [
        *("task", "model", "tool_result", "model"),
    ]


def test_continuing_an_unknown_conversation_is_refused(warm: ModuleType) -> None:
    with pytest.raises(ValueError, match="no conversation 'c-none' to continue"):
        warm.handler({"conversation_id": "c-none"}, None)


@pytest.mark.slow
def test_a_retry_after_a_missing_api_key_continues_the_saved_conversation(
    env: dict[str, str],
) -> None:
    event = {"conversation_id": "c-key", "message": "where is order 3?", "event_id": "e-1"}
    failed = cold(event, {**env, "MODEL": "claude-sonnet-5"})
    assert failed.returncode == 1
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("alpineagents.anthropic.MissingAPIKeyError: no Anthropic API key")
    assert "ANTHROPIC_API_KEY" in last
    # The id is taken by the conversation the failed event started, with its message.
    assert history(env, "c-key") == [("task", "where is order 3?")]

    def claude(body: dict[str, Any]) -> dict[str, Any]:
        return message(text(f"{len(body['messages'])} message(s): {body['messages']}"))

    with loopback(claude) as api:
        # The platform retries the same event, now with a key: the conversation goes on.
        retried = cold_ok(event, {**env, "MODEL": "claude-sonnet-5", **api.env()})
    assert retried["stopped_by"] == "reply"
    (request,) = api.requests
    assert request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "where is order 3?"}]}
    ]
    assert history(env, "c-key") == [("task", "where is order 3?"), ("model", retried["reply"])]
    # A new event (another id) adds its message as usual.
    again = cold_ok({**event, "message": "thanks", "event_id": "e-2"}, env)
    assert again["stopped_by"] == "reply"
    assert [kind for kind, _ in history(env, "c-key")] == ["task", "model", "user", "model"]
