"""A FileStore whose files this user may not open, for tests/test_filestore_foreign.py.

``python fs_denied.py PLACE TARGET``: saves State ``s`` in a store under the folder PLACE,
takes every permission off TARGET (``snapshot``, ``entries``, ``state folder`` or ``store
folder``), then loads, reads and saves a copy (lists and deletes, for a folder), and prints
one JSON object:
``{"ops": {op: {"error", "message", "is_permission_error", "denied_path"}}, "unchanged": …}``.

Run as root, it first makes PLACE another user's (nobody, 65534) and becomes that user once
everything is imported: root may open any file, whatever its mode.
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread  # noqa: F401 - imported before this process stops being root
import json
import os
import sys
from pathlib import Path
from typing import Any

from alpineagents import FileStore, State, StoreError

NOBODY = 65534


def snapshot_of_files(root: Path) -> dict[str, str]:
    """What can be seen of the files under ``root`` without opening them: names and sizes."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            found[str(path)] = str(os.lstat(path).st_size)
    return found


def main(place: Path, target: str) -> None:
    if os.geteuid() == 0:
        os.chown(place, NOBODY, NOBODY)
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    root = place / "runs"
    store = FileStore(root)
    state = State("task", id="s")
    state.add_user_message("hello")
    store.save(state)
    copy = store.load("s")
    denied = {
        "snapshot": root / "s" / "snapshot.json",
        "entries": root / "s" / "entries.jsonl",
        "state folder": root / "s",
        "store folder": root,
    }[target]
    before = snapshot_of_files(root) if target not in ("state folder", "store folder") else {}
    os.chmod(denied, 0)
    fresh = FileStore(root)
    copy.add_user_message("more")
    ops: dict[str, Any] = {
        "load": lambda: fresh.load("s"),
        "aload": lambda: asyncio.run(fresh.aload("s")),
        "read": lambda: fresh.read("s"),
        "save": lambda: fresh.save(copy),
        "asave": lambda: asyncio.run(fresh.asave(copy)),
    }
    if target == "store folder":
        ops["list"] = fresh.list
    if target in ("state folder", "store folder"):
        # A file that cannot be read can still be deleted: only its folder's mode matters.
        ops["delete"] = lambda: fresh.delete("s")
    outcomes = {}
    for name, op in ops.items():
        try:
            op()
        except StoreError as e:
            outcomes[name] = {
                "error": type(e).__name__,
                "message": str(e),
                "is_permission_error": isinstance(e, PermissionError),
                "denied_path": str(denied),
            }
        except Exception as e:  # noqa: BLE001 - the parent says which error it was
            outcomes[name] = {"error": type(e).__name__, "message": repr(e)}
        else:
            outcomes[name] = {"error": None, "message": "returned"}
    os.chmod(denied, 0o700 if denied.is_dir() else 0o600)
    unchanged = (not before or snapshot_of_files(root) == before) and [
        e.text for e in FileStore(root).load("s").history
    ] == ["task", "hello"]
    print(json.dumps({"ops": outcomes, "unchanged": unchanged}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
