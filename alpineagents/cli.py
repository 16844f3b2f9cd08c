"""The alpineagents command: list, show, remove, export, import, copy and move saved States.

    alpineagents ls STORE                 the saved States, newest first (--json, --limit, ...)
    alpineagents show STORE ID            one State as a readable transcript (--json: all of it)
    alpineagents rm STORE ID...           remove States (asks first unless --yes; --purge)
    alpineagents export STORE ID [-o F]   one State as a self-contained JSON document
    alpineagents import STORE FILE        write an exported State into a store
    alpineagents cp SRC DST [ID...]       copy States between stores (all of them without ids)
    alpineagents mv SRC DST [ID...]       move States: copy, then remove from SRC
    alpineagents sweep STORE              remove what killed processes left behind
    alpineagents doctor STORE             check that a store can work where it is

STORE, SRC and DST are a folder (a FileStore), file://PATH, s3://BUCKET/PREFIX
(pip install alpineagents-s3), or any scheme a plugin registers in the alpineagents.stores
entry-point group. A store read from must exist: a folder that does not exist is an error.

cp and mv can be run again after they were stopped or killed: States the destination
already holds identically are skipped. A different State under the same id is refused unless
--skip-existing or --overwrite says otherwise. The Python API behind them is
alpineagents.transfer.

On a terminal, ls shows the newest screenful and says how to see more (--all, --limit N);
piped or with --json it prints every State.

Exit status:
    0    success
    1    failure: the store could not be read or written, credentials, a corrupt State,
         a check of doctor that failed, ...
    2    usage: bad arguments, an invalid id or store URL, a removal not confirmed
    3    not found: no such State, folder, bucket or file
    4    conflict: the destination has a different State under the same id
    130  interrupted (Ctrl+C)
    141  the output pipe was closed (alpineagents ls STORE | head -1); nothing is printed

Set ALPINEAGENTS_DEBUG=1 to get a traceback instead of the one-line error. User info in a
URL (http://KEY:SECRET@host) is printed as *** in errors, tracebacks and store names.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING

from alpineagents._cli.redact import redact
from alpineagents._cli.status import (
    EXIT_CONFLICT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_USAGE,
    CommandError,
)

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = [
    "EXIT_CONFLICT",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_PIPE",
    "EXIT_USAGE",
    "CommandError",
    "main",
]

_EPILOG = __doc__[__doc__.index("STORE, SRC") :] if __doc__ else ""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors and help print no URL's user info."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        super()._print_message(redact(message), file)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="alpineagents",
        description="Look at, tidy, copy and archive saved alpineagents States.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help: str, aliases: Sequence[str] = ()) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=help,
            description=help,
            aliases=list(aliases),
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    ls = command("ls", "list the saved States, most recently updated first", ["list"])
    ls.add_argument("store", metavar="STORE")
    ls.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    how_many = ls.add_mutually_exclusive_group()
    how_many.add_argument("--limit", type=int, metavar="N", help="at most N States (after filters)")
    how_many.add_argument(
        "--all",
        action="store_true",
        help="every State, on a terminal too (which shows the newest screenful by default)",
    )
    ls.add_argument(
        "--stopped-by",
        choices=["reply", "finish", "ask", "max_steps", "none"],
        help="only States that stopped this way (none: not stopped, e.g. killed mid-run)",
    )
    ls.add_argument(
        "--since", metavar="WHEN", help="updated at or after WHEN: an ISO date/time or 30m, 12h, 7d"
    )
    ls.add_argument("--before", metavar="WHEN", help="updated before WHEN (same forms)")

    show = command("show", "show one State: a header, then its history as a transcript")
    show.add_argument("store", metavar="STORE")
    show.add_argument("id", metavar="ID")
    show.add_argument("--json", action="store_true", help="print the whole State as JSON")

    rm = command("rm", "remove saved States", ["delete"])
    rm.add_argument("store", metavar="STORE")
    rm.add_argument("ids", metavar="ID", nargs="+")
    rm.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    rm.add_argument(
        "--purge",
        action="store_true",
        help="also remove every version and leftover of each State (for a store whose "
        "delete() takes purge=, such as a folder or s3://)",
    )

    export = command("export", "write one State as a self-contained JSON document")
    export.add_argument("store", metavar="STORE")
    export.add_argument("id", metavar="ID")
    export.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: stdout)")

    imp = command("import", "write an exported State into a store, under its own id")
    imp.add_argument("store", metavar="STORE")
    imp.add_argument("file", metavar="FILE", help="a file written by export, or - for stdin")
    _on_exists_options(imp)

    for name, help in (
        ("cp", "copy States from SRC to DST (every State of SRC without ids)"),
        ("mv", "move States from SRC to DST: copy each, then remove it from SRC"),
    ):
        transfer = command(name, help)
        transfer.add_argument("src", metavar="SRC")
        transfer.add_argument("dst", metavar="DST")
        transfer.add_argument("ids", metavar="ID", nargs="*")
        _on_exists_options(transfer)
        transfer.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    sweep = command(
        "sweep",
        "remove what killed processes left behind (never a State, nor a write under way)",
    )
    sweep.add_argument("store", metavar="STORE")
    sweep.add_argument(
        "--older-than",
        metavar="AGE",
        default="1d",
        help="for stores that go by age (S3): only leftovers older than AGE (30m, 12h, 7d); "
        "default 1d",
    )
    doctor = command(
        "doctor",
        "check that a store can work where it is (its own checks: folder, modes, locks, ...)",
    )
    doctor.add_argument("store", metavar="STORE")
    return parser


def _on_exists_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--skip-existing",
        dest="on_exists",
        action="store_const",
        const="skip",
        default="error",
        help="keep a different State the destination has under the same id",
    )
    group.add_argument(
        "--overwrite",
        dest="on_exists",
        action="store_const",
        const="overwrite",
        help="replace a different State the destination has under the same id",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); the exit status."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a usage error argparse already reported
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.version:
        print(_version())
        return EXIT_OK
    if args.command is None:
        parser.print_usage(sys.stderr)
        print(
            "alpineagents: error: a command is required (see alpineagents --help)", file=sys.stderr
        )
        return EXIT_USAGE
    if args.command in ("ls", "list") and args.limit is not None and args.limit < 0:
        return _fail("--limit must be 0 or more", EXIT_USAGE)
    try:
        from alpineagents._cli.commands import run

        status = run(args)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        return _closed_pipe()
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except Exception as e:  # noqa: BLE001 - printed as a one-line error or a redacted traceback
        message, status = _explain(e)
        if message is None or os.environ.get("ALPINEAGENTS_DEBUG"):
            # A traceback, as Python prints one, but without a URL's user info.
            _flush_quietly()
            text = "".join(traceback.format_exception(e))
            print(redact(text), end="", file=sys.stderr)
            return status
        return _fail(message, status)


def _fail(message: str, status: int) -> int:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return _closed_pipe()
    print(f"alpineagents: error: {redact(' '.join(message.split()))}", file=sys.stderr)
    return status


def _flush_quietly() -> None:
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        pass


def _closed_pipe() -> int:
    # Whatever is still buffered for stdout goes nowhere, and Python's exit flush is quiet.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return EXIT_PIPE


def _explain(e: Exception) -> tuple[str | None, int]:
    """The one-line message and exit status for an expected exception; (None, _) otherwise."""
    from alpineagents.errors import AlpineAgentsError, StateExistsError
    from alpineagents.transfer import TransferConflictError

    if isinstance(e, CommandError):
        return str(e), e.status
    if isinstance(e, TransferConflictError):
        return (
            f"{e.destination} already has a different State with id {e.state_id!r} than "
            f"{e.source}: run again with --skip-existing to keep it or --overwrite to replace it",
            EXIT_CONFLICT,
        )
    if isinstance(e, StateExistsError):
        return str(e), EXIT_CONFLICT
    if isinstance(e, KeyError | FileNotFoundError):
        return (str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)), EXIT_NOT_FOUND
    if isinstance(e, ValueError):
        return str(e), EXIT_USAGE
    if isinstance(e, ImportError):
        return str(e), EXIT_FAILURE
    if isinstance(e, AlpineAgentsError | OSError):
        return str(e) or type(e).__name__, EXIT_FAILURE
    return None, EXIT_FAILURE


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = f"alpineagents {version('alpineagents')}"
    except PackageNotFoundError:
        text = "alpineagents (not installed)"
    try:
        text += f" (alpineagents-s3 {version('alpineagents-s3')})"
    except PackageNotFoundError:
        pass
    return text


if __name__ == "__main__":
    sys.exit(main())
