"""Bad input never leaves a State that cannot be saved or loaded.

Each test runs a real Agent with an offline model on a FileStore, feeds it one value JSON
cannot hold or read back, and checks the error (documented, naming the path), then that the
State still saves and loads with nothing lost.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic
import pytest

from alpineagents import Agent, FileStore, State, Store
from alpineagents.errors import NotJSONError
from alpineagents.history import MAX_DEPTH, MODEL, TOOL_RESULT
from alpineagents.model import ModelRequest, ModelResponse
from alpineagents.testing import FunctionModel, TestModel, call
from tests.helpers import Mode, results, run, script

BAD_TEXT = b"caf\xe9".decode(errors="surrogateescape")  # "caf\udce9": UTF-8 cannot encode it


def nested(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


def contains_itself() -> Any:
    loop: list[Any] = [1]
    loop.append(loop)
    return loop


def too_many_digits() -> int:
    limit = sys.get_int_max_str_digits() or sys.int_info.default_max_str_digits
    value: int = 10 ** (limit + 700)
    return value  # hundreds of digits beyond what json.loads reads back


# (value maker, words the message must have)
BAD_VALUES: dict[str, tuple[Callable[[], Any], str]] = {
    "lone surrogate": (lambda: BAD_TEXT, "lone surrogate"),
    "nan": (lambda: float("nan"), "nan"),
    "infinity": (lambda: float("-inf"), "-inf"),
    "too deep": (lambda: nested(MAX_DEPTH + 5), f"more than {MAX_DEPTH} levels"),
    "contains itself": (contains_itself, "contains itself"),
    "too many digits": (too_many_digits, "digits"),
    "surrogate key": (lambda: {BAD_TEXT: 1}, "a key of"),
}


def snapshot_of_history(state: State) -> list[tuple[int, str, str, dict[str, Any]]]:
    return [(e.seq, e.kind, e.text, e.data) for e in state.history]


async def save_and_load(mode: Mode, store: Store, state: State) -> State:
    """Save ``state`` (it must not raise), load it back, and check nothing was lost."""
    if mode == "async":
        await store.asave(state)
        loaded = await store.aload(state.id)
    else:
        await asyncio.to_thread(store.save, state)
        loaded = await asyncio.to_thread(store.load, state.id)
    assert snapshot_of_history(loaded) == snapshot_of_history(state)
    assert loaded.data == state.data
    assert loaded.stopped_by == state.stopped_by
    return loaded


def lookup_tool(returns: Callable[[], Any], ran: list[str]) -> Callable[..., Any]:
    def lookup(q: str) -> Any:
        """Look something up."""
        ran.append(q)
        return returns()

    return lookup


# state.data ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", list(BAD_VALUES))
async def test_bad_data_is_refused_at_save_naming_its_path_and_a_fixed_state_saves(
    mode: Mode, tmp_path: Path, bad: str
) -> None:
    make, words = BAD_VALUES[bad]
    store = FileStore(tmp_path)
    agent = Agent(TestModel(answer="ok"), store=store)
    state = State("task", id="bad-data", data={"a": [0, 1, 2, "fine"]})
    assert await run(mode, agent, state) == "ok"
    before = (tmp_path / "bad-data" / "snapshot.json").read_bytes()

    state.data["a"][3] = make()
    save = agent.asave(state) if mode == "async" else asyncio.to_thread(agent.save, state)
    with pytest.raises(TypeError) as raised:
        await save
    assert isinstance(raised.value, NotJSONError)
    assert "state.data['a'][3]" in str(raised.value)
    assert words in str(raised.value)
    assert (tmp_path / "bad-data" / "snapshot.json").read_bytes() == before  # nothing written

    # The run refuses it too, before any model request, and writes nothing.
    state.add_user_message("again")
    requests = len(agent.model.requests)  # type: ignore[attr-defined]
    with pytest.raises(NotJSONError):
        await run(mode, agent, state)
    assert len(agent.model.requests) == requests  # type: ignore[attr-defined]

    state.data["a"][3] = "café"
    assert await run(mode, agent, state) == "ok"
    loaded = await save_and_load(mode, store, state)
    assert loaded.data == {"a": [0, 1, 2, "café"]}
    assert [e.text for e in loaded.history if e.kind == "user"] == ["again"]


async def test_data_as_deep_as_allowed_saves_and_loads_back(mode: Mode, tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    deepest = nested(MAX_DEPTH)
    state = State("task", data={"deep": nested(MAX_DEPTH - 1), "int": 10**4000})
    await run(mode, Agent(TestModel(answer="ok"), store=store), state)
    loaded = await save_and_load(mode, store, state)
    assert loaded.data["int"] == 10**4000

    state.data["deep"] = deepest  # one level more: data itself is a level
    with pytest.raises(NotJSONError, match="levels deep"):
        await save_and_load(mode, store, state)


# Messages and the task -----------------------------------------------------------------------


async def test_a_user_message_or_task_with_a_lone_surrogate_is_refused_at_once(
    mode: Mode, tmp_path: Path
) -> None:
    with pytest.raises(NotJSONError, match="the State's task holds a lone surrogate"):
        State(BAD_TEXT)

    store = FileStore(tmp_path)
    agent = Agent(TestModel(answer="ok"), store=store)
    state = State("task")
    await run(mode, agent, state)
    entries = len(state.history)
    with pytest.raises(TypeError, match="the user message holds a lone surrogate"):
        state.add_user_message(BAD_TEXT)
    assert len(state.history) == entries
    state.add_user_message("café")
    assert await run(mode, agent, state) == "ok"
    await save_and_load(mode, store, state)


# Tool results --------------------------------------------------------------------------------


@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "two calls"])
async def test_a_tool_result_that_cannot_be_saved_becomes_an_error_result(
    mode: Mode, tmp_path: Path, parallel: bool
) -> None:
    ran: list[str] = []

    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    calls = [call("lookup", q="x")] + ([call("add", a=1, b=2)] if parallel else [])
    seen: list[ModelRequest] = []

    def respond(request: ModelRequest) -> Any:
        seen.append(request)
        return calls if len(seen) == 1 else "done"

    store = FileStore(tmp_path)
    agent = Agent(
        FunctionModel(respond), tools=[lookup_tool(lambda: BAD_TEXT, ran), add], store=store
    )
    state = State("task")
    assert await run(mode, agent, state) == "done"
    assert ran == ["x"]
    by_name = {name: (text, is_error) for name, text, is_error in results(state)}
    text, is_error = by_name["lookup"]
    assert is_error
    assert f"tool result of {calls[0]['id']} (lookup) holds a lone surrogate" in text
    assert text.startswith("NotJSONError: ")
    if parallel:
        assert by_name["add"] == ("3", False)
    # The model saw the error result.
    sent = [b for m in seen[1].messages if m["role"] == "user" for b in m["content"]]
    assert any(b.get("type") == "tool_result" and b["is_error"] for b in sent)
    await save_and_load(mode, store, state)


async def test_a_tool_error_whose_message_holds_a_lone_surrogate_is_saved(
    mode: Mode, tmp_path: Path
) -> None:
    def read(path: str) -> str:
        """Read a file."""
        raise ValueError(f"cannot read {BAD_TEXT}")  # as str(bytes, errors="surrogateescape")

    store = FileStore(tmp_path)
    model = script([call("read", path="x")], "done")
    state = State("task")
    assert await run(mode, Agent(model, tools=[read], store=store), state) == "done"
    [(name, text, is_error)] = results(state)
    assert (name, is_error) == ("read", True)
    assert "lone surrogate" in text
    await save_and_load(mode, store, state)


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message today")


async def test_a_tool_exception_whose_str_raises_gives_its_type_name(
    mode: Mode, tmp_path: Path
) -> None:
    def flaky(n: int) -> int:
        """Fail oddly."""
        raise UnprintableError()

    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    store = FileStore(tmp_path)
    for calls in ([call("flaky", n=1)], [call("flaky", n=1), call("add", a=1, b=1)]):
        agent = Agent(script(calls, "done"), tools=[flaky, add], store=store)
        state = State("task")
        assert await run(mode, agent, state) == "done"
        found = dict((name, (text, err)) for name, text, err in results(state))
        assert found["flaky"] == (
            "UnprintableError (its message could not be read: RuntimeError)",
            True,
        )
        await save_and_load(mode, store, state)


# Tool input from the model ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", list(BAD_VALUES))
async def test_tool_input_that_cannot_be_saved_is_not_run_and_the_model_is_told(
    mode: Mode, tmp_path: Path, bad: str
) -> None:
    make, words = BAD_VALUES[bad]
    ran: list[str] = []
    bad_call = call("lookup", q=make())
    seen: list[ModelRequest] = []

    def respond(request: ModelRequest) -> Any:
        seen.append(request)
        return [bad_call] if len(seen) == 1 else "done"

    store = FileStore(tmp_path)
    agent = Agent(FunctionModel(respond), tools=[lookup_tool(lambda: "x", ran)], store=store)
    state = State("task")
    assert await run(mode, agent, state) == "done"
    assert ran == []
    [(name, text, is_error)] = results(state)
    assert (name, is_error) == ("lookup", True)
    assert text.startswith("Invalid input for tool 'lookup': ")
    assert f"tool input of {bad_call['id']} (lookup)['q']" in text
    assert words in text
    assert text.endswith("Call it again with valid input.")
    model_entry = next(e for e in state.history if e.kind == MODEL)
    assert model_entry.as_model().tool_calls[0]["input"] == {}
    assert len(seen) == 2  # the model was asked again, with the error result
    await save_and_load(mode, store, state)


async def test_a_finish_answer_that_cannot_be_saved_is_refused_and_finish_called_again(
    mode: Mode, tmp_path: Path
) -> None:
    replies: list[Any] = [
        [call("finish", answer=float("nan"))],  # NaN in the tool input
        [call("finish", answer="NaN")],  # valid input; the float it gives is NaN
        [call("finish", answer=1.5)],
    ]
    store = FileStore(tmp_path)
    agent = Agent(script(*replies), output_type=float, store=store)
    state = State("task")
    assert await run(mode, agent, state) == 1.5
    texts = [e.text for e in state.history if e.kind == TOOL_RESULT]
    assert "tool input of" in texts[0] and "['answer'] is nan" in texts[0]
    assert texts[1].startswith("The answer is not valid: the finish answer is nan")
    assert texts[2] == "Answer accepted."
    loaded = await save_and_load(mode, store, state)
    assert loaded.answer == 1.5


async def test_model_text_with_a_lone_surrogate_is_kept_with_a_replacement_character(
    mode: Mode, tmp_path: Path
) -> None:
    store = FileStore(tmp_path)
    state = State("task")
    reply = await run(mode, Agent(FunctionModel(lambda r: BAD_TEXT), store=store), state)
    assert reply == "caf\ufffd"
    await save_and_load(mode, store, state)


async def test_a_response_block_that_cannot_be_saved_ends_the_run_and_the_state_saves(
    mode: Mode, tmp_path: Path
) -> None:
    blocks: list[dict[str, Any]] = [
        {"type": "text", "text": "hi"},
        {"type": "server_result", "score": float("nan")},
    ]
    store = FileStore(tmp_path)
    state = State("task")
    agent = Agent(FunctionModel(lambda r: ModelResponse(blocks)), store=store)
    with pytest.raises(NotJSONError, match=r"history entry 1\['content'\]\[1\]\['score'\]"):
        await run(mode, agent, state)
    assert [e.kind for e in state.history] == ["task"]  # the response was not recorded
    await save_and_load(mode, store, state)


# Finish answers changed in place ---------------------------------------------------------------


class Count(pydantic.BaseModel):
    n: int
    x: float = 0.0


async def test_an_accepted_answer_changed_in_place_is_saved(mode: Mode, tmp_path: Path) -> None:
    store = FileStore(tmp_path)

    async def save(agent: Agent, state: State) -> None:
        if mode == "async":
            await agent.asave(state)
        else:
            await asyncio.to_thread(agent.save, state)

    agent = Agent(TestModel(answer={"n": 3}), output_type=Count, store=store)
    state = State("task", id="typed")
    assert await run(mode, agent, state) == Count(n=3)
    state.answer.n = 4
    await save(agent, state)
    assert (await save_and_load(mode, store, state)).answer == {"n": 4, "x": 0.0}

    # A change that JSON cannot hold is refused, naming the answer; fixed, it saves.
    state.answer.x = float("inf")
    with pytest.raises(NotJSONError, match=r"state.answer\['x'\] is inf"):
        await save(agent, state)
    state.answer.x = 2.5
    await save(agent, state)
    assert (await save_and_load(mode, store, state)).answer == {"n": 4, "x": 2.5}

    listing = Agent(TestModel(answer=[1, 2]), output_type=list[int], store=store)
    state = State("task", id="listed")
    assert await run(mode, listing, state) == [1, 2]
    state.answer.append(3)
    await save(listing, state)
    assert (await save_and_load(mode, store, state)).answer == [1, 2, 3]


# The same limits on S3 -------------------------------------------------------------------------


async def test_s3store_gets_the_same_refusals_and_loads_what_it_saved(
    mode: Mode, bucket: str, moto_url: str
) -> None:
    from alpineagents_s3 import S3Store

    ran: list[str] = []
    bad_call = call("lookup", q=float("nan"))
    good_call = call("lookup", q="x")
    store = S3Store(bucket, "bad-input", endpoint_url=moto_url)
    model = script([bad_call], [good_call], "done")
    agent = Agent(model, tools=[lookup_tool(lambda: BAD_TEXT, ran)], store=store)
    state = State("task", data={"deep": nested(MAX_DEPTH - 1), "int": 10**4000})
    try:
        assert await run(mode, agent, state) == "done"
        assert ran == ["x"]
        texts = [text for _, text, _ in results(state)]
        assert f"tool input of {bad_call['id']} (lookup)['q'] is nan" in texts[0]
        assert f"tool result of {good_call['id']} (lookup) holds a lone surrogate" in texts[1]
        await save_and_load(mode, store, state)

        state.data["deep"] = [state.data["deep"]]
        with pytest.raises(NotJSONError, match=r"state.data\['deep'\]"):
            await save_and_load(mode, store, state)
        state.data["deep"] = "shallow"
        assert (await save_and_load(mode, store, state)).data["deep"] == "shallow"
    finally:
        if mode == "async":
            await store.aclose()
        else:
            store.close()


@pytest.mark.parametrize("levels", [MAX_DEPTH - 4, MAX_DEPTH - 3, MAX_DEPTH - 1])
def test_tool_input_too_deep_for_the_response_entry_gets_an_error_result(
    tmp_path: Path, levels: int
) -> None:
    """Input that fits on its own but not inside the model's response entry (3 levels down)
    is refused as input, with an error result the model reads, like any input that cannot be
    saved: the run goes on (found by tests/test_bad_input_both_stores.py)."""
    deep: Any = None
    for _ in range(levels):
        deep = [deep]
    ran: list[object] = []

    def echo(v: object) -> str:
        """Echo."""
        ran.append(v)
        return "ok"

    def respond(request: ModelRequest) -> Any:
        if any(m["role"] == "assistant" for m in request.messages):
            return "done"
        return [call("echo", v=deep)]

    store = FileStore(tmp_path)
    state = State("deep input")
    assert Agent(FunctionModel(respond), tools=[echo], store=store).run(state) == "done"
    fits = levels + 4 <= MAX_DEPTH  # ["content"][0]["input"]["v"], then the nesting
    assert len(ran) == (1 if fits else 0)
    (result,) = [e for e in store.load(state.id).history if e.kind == TOOL_RESULT]
    assert result.text == "ok" if fits else "tool input of" in result.text
