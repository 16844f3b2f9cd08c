"""The commands of ``alpineagents``: each takes the parsed arguments and returns a status."""

from __future__ import annotations

import argparse
import asyncio
import builtins
import contextlib
import inspect
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from alpineagents._cli import render
from alpineagents._cli.redact import redact, shown
from alpineagents._cli.status import (
    EXIT_FAILURE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
)
from alpineagents._cli.stores import _not_found, _SyncOver, opened, takes
from alpineagents.state import validate_id
from alpineagents.store import SavedState, Store


def run(args: argparse.Namespace) -> int:
    """Run the command ``args.command``."""
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "ls": ls,
        "list": ls,
        "show": show,
        "rm": rm,
        "delete": rm,
        "export": export,
        "import": import_,
        "cp": transfer,
        "mv": transfer,
        "sweep": sweep,
        "doctor": doctor,
    }
    return commands[args.command](args)


def _on_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _print_json(value: Any, indent: int | None = None) -> None:
    """Print ``value`` as JSON, in pieces: a closed pipe is noticed at once, not at exit."""
    encoder = json.JSONEncoder(ensure_ascii=False, indent=indent, default=str)
    for piece in encoder.iterencode(value):
        sys.stdout.write(piece)
    sys.stdout.write("\n")


# ls ---------------------------------------------------------------------------------------

_RELATIVE = re.compile(r"(\d+)\s*([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_when(text: str, option: str) -> datetime:
    """An ISO date/time (UTC unless it says) or an age such as ``30m``, ``12h``, ``7d``."""
    relative = _RELATIVE.fullmatch(text.strip())
    if relative:
        amount, unit = relative.groups()
        return datetime.now(UTC) - timedelta(**{_UNITS[unit]: int(amount)})
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(
            f"{option} {text!r}: give an ISO date or time (2026-05-01, 2026-05-01T12:00) "
            "or an age (30m, 12h, 7d, 2w)",
            EXIT_USAGE,
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def ls(args: argparse.Namespace) -> int:
    """List the saved States, newest first; on a terminal, the newest screenful."""
    since = parse_when(args.since, "--since") if args.since else None
    before = parse_when(args.before, "--before") if args.before else None
    page = _page_size(args)
    want = args.limit if args.limit is not None else page
    filtered = args.stopped_by is not None or since is not None or before is not None
    with opened(args.store, must_exist=True) as store:
        if want is None or filtered:
            found = store.list()
        else:
            found = newest(store, want + 1 if page is not None else want)
        listed = [
            saved
            for saved in found
            if (args.stopped_by is None or (saved.stopped_by or "none") == args.stopped_by)
            and (since is None or saved.updated_at >= since)
            and (before is None or saved.updated_at < before)
        ]
        more = want is not None and page is not None and len(listed) > want
        if want is not None:
            listed = listed[:want]
        counts = _entry_counts(store, [saved.id for saved in listed])
    rows = [(saved, counts[saved.id]) for saved in listed]
    if args.json:
        _print_json([render.summary_json(saved, n) for saved, n in rows])
    else:
        size = _terminal_size() if _on_terminal(sys.stdout) else None
        for line in render.table(rows, size.columns if size else None):
            print(line)
    if more:
        print(
            f"(the {len(rows)} most recently updated; there are more: --all for every State, "
            "--limit N for N)",
            file=sys.stderr,
        )
    return EXIT_OK


def _page_size(args: argparse.Namespace) -> int | None:
    """How many States ``ls`` shows unasked: a screenful on a terminal, else all (None)."""
    if args.all or args.json or args.limit is not None or not _on_terminal(sys.stdout):
        return None
    size = _terminal_size()
    return max(10, (size.lines if size else 24) - 3)  # the header, the note and the prompt


def _terminal_size() -> os.terminal_size | None:
    try:
        return os.get_terminal_size(sys.stdout.fileno())
    except (OSError, ValueError):
        return None


def newest(store: Store, limit: int) -> builtins.list[SavedState]:
    """The ``limit`` most recently updated States: through ``list(limit=)`` where taken."""
    if takes(store.list, "limit"):
        listed: builtins.list[SavedState] = store.list(limit=limit)  # type: ignore[call-arg]
        return listed[:limit]
    return store.list()[:limit]


def _entry_counts(store: Store, ids: builtins.list[str]) -> dict[str, int | None]:
    """How many history entries each State has (one read each, a few at a time)."""

    def count(state_id: str) -> int | None:
        record = store.read(state_id)
        return None if record is None else len(record.entries)

    if isinstance(store, _SyncOver) or len(ids) < 2:
        return {state_id: count(state_id) for state_id in ids}
    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip(ids, pool.map(count, ids), strict=True))


# show -------------------------------------------------------------------------------------


def show(args: argparse.Namespace) -> int:
    """Print one State: a header, then its history as a transcript (or all of it as JSON)."""
    validate_id(args.id)
    with opened(args.store, must_exist=True) as store:
        record = store.read(args.id)
        if record is None:
            raise _not_found(args.id, store, args.store)
        try:
            state = store.load(args.id)
        except KeyError:  # removed since the read
            raise _not_found(args.id, store, args.store) from None
    saved = len(record.entries)
    if args.json:
        _print_json(render.state_json(state, saved), indent=2)
    else:
        for line in render.transcript(state, saved):
            print(line)
    return EXIT_OK


# rm ---------------------------------------------------------------------------------------


def rm(args: argparse.Namespace) -> int:
    """Remove (or purge) States, after asking unless ``--yes``; print what each delete reports."""
    ids = [validate_id(state_id) for state_id in dict.fromkeys(args.ids)]
    with opened(args.store, must_exist=True) as store:
        delete = getattr(store, "inner", store).adelete if isinstance(store, _SyncOver) else None
        if args.purge and not takes(delete or store.delete, "purge"):
            raise CommandError(
                f"{shown(store)} cannot purge: its delete() takes no purge= (rm without "
                "--purge removes the States)",
                EXIT_USAGE,
            )
        have = {saved.id for saved in store.list()}
        for state_id in ids:
            if state_id not in have:
                raise _not_found(state_id, store, args.store)
        verb = "Purge" if args.purge else "Remove"
        if not args.yes:
            if not _on_terminal(sys.stdin):
                raise CommandError(
                    f"not removing {len(ids)} State(s) from {shown(store)} without "
                    "confirmation: pass --yes",
                    EXIT_USAGE,
                )
            what = " (every version and leftover)" if args.purge else ""
            print(
                f"{verb} {len(ids)} State(s) from {shown(store)}{what}: {', '.join(ids)}? [y/N] ",
                end="",
                file=sys.stderr,
                flush=True,
            )
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                print("nothing removed", file=sys.stderr)
                return EXIT_USAGE
        for state_id in ids:
            try:
                if args.purge:
                    report = store.delete(state_id, purge=True)  # type: ignore[call-arg,func-returns-value]
                else:
                    report = store.delete(state_id)  # type: ignore[func-returns-value]
            except KeyError:
                raise _not_found(state_id, store, args.store) from None
            print(redact(str(report)) if report is not None else f"removed {state_id}")
    return EXIT_OK


# sweep --------------------------------------------------------------------------------------


def sweep(args: argparse.Namespace) -> int:
    """Remove leftovers of killed processes, through the store's own ``sweep``."""
    age = _RELATIVE.fullmatch(args.older_than.strip())
    if not age:
        raise CommandError(
            f"--older-than {args.older_than!r}: give an age (30m, 12h, 7d, 2w)", EXIT_USAGE
        )
    seconds = timedelta(**{_UNITS[age[2]]: int(age[1])}).total_seconds()
    with opened(args.store, must_exist=True) as store:
        inner = getattr(store, "inner", store)
        method = getattr(inner, "sweep", None)
        if method is None:
            raise CommandError(f"{shown(store)} has no sweep: it leaves nothing behind", EXIT_USAGE)
        takes_age = "older_than" in inspect.signature(method).parameters
        removed = method(older_than=seconds) if takes_age else method()
        for item in removed:
            print(f"removed {item}")
        print(f"{len(removed)} leftover(s) removed from {shown(store)}", file=sys.stderr)
    return EXIT_OK


# doctor -------------------------------------------------------------------------------------


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def doctor(args: argparse.Namespace) -> int:
    """Print the checks of the store's own ``doctor()``; 1 if any failed.

    A check is anything with ``name``, ``ok`` and ``detail`` (each store has its own class).
    """
    with opened(args.store, must_exist=False) as store:
        inner = getattr(store, "inner", store)
        method = getattr(inner, "doctor", None)
        if method is None:
            print(f"{shown(store)} has no checks: it has no doctor()")
            return EXIT_OK
        checks = method()
        if inspect.isawaitable(checks):
            pending = _awaited(checks)
            checks = store.run(pending) if isinstance(store, _SyncOver) else asyncio.run(pending)
        failed = 0
        for check in checks:
            ok = bool(getattr(check, "ok", False))
            failed += not ok
            name, detail = getattr(check, "name", "?"), getattr(check, "detail", "")
            print(redact(f"{'ok' if ok else 'FAILED':<6}  {name}: {detail}"))
        summary = f"{failed} of {len(checks)} check(s) failed" if failed else "every check passed"
        print(f"{shown(store)}: {summary}", file=sys.stderr)
    return EXIT_FAILURE if failed else EXIT_OK


# export / import ----------------------------------------------------------------------------


def export(args: argparse.Namespace) -> int:
    """Write one State as a JSON document, to stdout or a file."""
    from alpineagents.transfer import export_state

    validate_id(args.id)
    with opened(args.store, must_exist=True) as store:
        try:
            document = export_state(store, args.id)
        except KeyError:
            raise _not_found(args.id, store, args.store) from None
    if args.output in (None, "-"):
        _print_json(document, indent=1)
        return EXIT_OK
    text = json.dumps(document, ensure_ascii=False, indent=1) + "\n"
    _write_private(Path(args.output), text.encode())
    print(
        f"exported {args.id} ({len(document['entries'])} entries) to {args.output}", file=sys.stderr
    )
    return EXIT_OK


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by its owner only (history holds messages)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except FileNotFoundError:
        raise CommandError(
            f"cannot write {path}: its folder does not exist", EXIT_NOT_FOUND
        ) from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def import_(args: argparse.Namespace) -> int:
    """Write an exported State into a store."""
    from alpineagents.transfer import import_state

    if args.file == "-":
        data, where = sys.stdin.buffer.read(), "stdin"
    else:
        try:
            data, where = Path(args.file).read_bytes(), args.file
        except FileNotFoundError:
            raise CommandError(f"no file {args.file!r} to import", EXIT_NOT_FOUND) from None
        except IsADirectoryError:
            raise CommandError(
                f"{args.file!r} is a folder, not an exported State", EXIT_USAGE
            ) from None
    with opened(args.store, must_exist=False) as store:
        outcome = import_state(store, data, on_exists=args.on_exists, where=where)
    print(render.outcome_line(outcome, store))
    return EXIT_OK


# cp / mv ----------------------------------------------------------------------------------


def transfer(args: argparse.Namespace) -> int:
    """Copy or move States between two stores, with progress on a terminal."""
    from alpineagents.transfer import copy_states, move_states

    move = args.command == "mv"
    ids = [validate_id(state_id) for state_id in args.ids]
    with opened(args.src, must_exist=True) as src, opened(args.dst, must_exist=False) as dst:
        bar = (
            render.ProgressBar(sys.stderr) if _on_terminal(sys.stderr) and not args.quiet else None
        )

        def progress(outcome: Any, done: int, total: int) -> None:
            if bar is not None:
                bar.clear()
            if not args.quiet:
                print(render.outcome_line(outcome, dst), flush=True)
            if bar is not None:
                bar.draw(done, total, outcome.id)

        copy = move_states if move else copy_states
        try:
            done = copy(src, dst, ids or None, on_exists=args.on_exists, progress=progress)
        finally:
            if bar is not None:
                bar.clear()
    if not args.quiet:
        print(render.transfer_summary(done, move, src, dst), file=sys.stderr)
    return EXIT_OK
