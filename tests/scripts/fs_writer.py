"""A child process that writes one State of a FileStore, for tests/test_filestore_writers.py and
tests/test_filestore_leftovers.py.

Three ways to run it (``python fs_writer.py WAY ...``):

``stress ROOT ID NAME COUNT sync|async START``
    Waits until the time ``START``, then makes ``COUNT`` changes to the State, each saved at
    once: a message saved whole, a message saved alone (as a tool result is) or an item added
    to ``state.data[NAME]``. A refused save (``ConcurrentWriteError``) reloads the State and
    makes the change again. Prints one JSON line: the changes acknowledged and the refusals.
``repl ROOT``
    Reads one JSON command a line (``load``, ``say``, ``data``, ``save``) and answers each with
    one JSON line, ``{"ok": ...}`` or ``{"error": <class name>, "message": ...}``.
``churn ROOT``
    Creates, saves and deletes States in a loop until it is killed; prints ``ready`` after the
    first round.
``pause ROOT ID create|delete|snapshot|purge``
    Starts a create, a delete, a save or a purge of the State and stops for good at the
    moment the store renames its new folder, removes a deleted one, replaces the snapshot or
    (a purge) has removed one file, after printing ``paused``: the parent kills it there.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from alpineagents import FileStore, State, _saving
from alpineagents._filestore import leftovers
from alpineagents.errors import ConcurrentWriteError


def stress(root: str, state_id: str, name: str, count: int, mode: str, start: float) -> None:
    store = FileStore(root)
    while time.time() < start:
        time.sleep(0.001)
    state = store.load(state_id)
    messages: list[int] = []
    data: list[int] = []
    refused = 0
    for i in range(count):
        kind = i % 3
        while True:
            if kind == 2:
                state.data[name] = [*state.data.get(name, []), i]
            else:
                state.add_user_message(f"{name} {i}")
            try:
                if mode == "async":
                    asyncio.run(_saving.asave(store, state, entries_only=kind == 1))
                else:
                    _saving.save(store, state, entries_only=kind == 1)
            except ConcurrentWriteError:
                refused += 1
                state = store.load(state_id)
                continue
            (data if kind == 2 else messages).append(i)
            break
    print(json.dumps({"messages": messages, "data": data, "refused": refused}), flush=True)


def repl(root: str) -> None:
    store = FileStore(root)
    state: State | None = None
    for line in sys.stdin:
        command: dict[str, Any] = json.loads(line)
        op = command["op"]
        try:
            answer: Any = None
            if op == "load":
                if command.get("async"):
                    state = asyncio.run(store.aload(command["id"]))
                else:
                    state = store.load(command["id"])
                answer = [entry.text for entry in state.history]
            elif op == "say":
                assert state is not None
                state.add_user_message(command["text"])
            elif op == "data":
                assert state is not None
                state.data[command["key"]] = command["value"]
            elif op == "save":
                assert state is not None
                only = bool(command.get("entries_only"))
                if command.get("async"):
                    answer = asyncio.run(_saving.asave(store, state, entries_only=only))
                else:
                    answer = _saving.save(store, state, entries_only=only)
            else:
                raise ValueError(f"unknown command {op!r}")
        except Exception as e:  # noqa: BLE001 - the parent checks which error it was
            print(json.dumps({"error": type(e).__name__, "message": str(e)}), flush=True)
        else:
            print(json.dumps({"ok": answer}), flush=True)


def churn(root: str) -> None:
    store = FileStore(root)
    n = 0
    while True:
        state = State(f"churned {n}", id=f"c{os.getpid()}-{n}")
        store.save(state)
        state.add_user_message("x" * (n % 7 * 1000))
        state.data["n"] = n
        store.save(state)
        if n % 2 == 0:
            store.delete(state.id)
        if n == 0:
            print("ready", flush=True)
        n += 1


def _stop_here(*args: object, **kwargs: object) -> None:
    print("paused", flush=True)
    while True:
        time.sleep(60)


def pause(root: str, state_id: str, where: str) -> None:
    store = FileStore(root)
    if where == "create":
        os.rename = _stop_here
        store.save(State("never renamed into place", id=state_id))
    elif where == "delete":
        leftovers._remove_tree = _stop_here  # type: ignore[attr-defined,assignment]
        store.delete(state_id)
    elif where == "purge":
        real_unlink = os.unlink

        def unlink_once(path: Any, **kwargs: Any) -> None:
            real_unlink(path, **kwargs)
            os.unlink = _stop_here

        os.unlink = unlink_once
        store.delete(state_id, purge=True)
    elif where == "snapshot":
        state = store.load(state_id)
        state.add_user_message("saved before the snapshot")
        os.replace = _stop_here
        store.save(state)
    raise SystemExit(f"did not stop at {where}")


def main(argv: list[str]) -> None:
    way, *rest = argv
    if way == "stress":
        root, state_id, name, count, mode, start = rest
        stress(root, state_id, name, int(count), mode, float(start))
    elif way == "repl":
        repl(rest[0])
    elif way == "churn":
        churn(rest[0])
    elif way == "pause":
        pause(*rest)
    else:
        raise SystemExit(f"unknown way {way!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
