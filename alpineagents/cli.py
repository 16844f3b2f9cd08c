"""The ``alpineagents`` command: look at and tidy saved States.

    alpineagents list STORE            the saved States, most recently updated first
    alpineagents show STORE ID         one State's history
    alpineagents delete STORE ID       remove a State

STORE is a folder (a FileStore) or a store URL such as ``s3://bucket/prefix``.
"""

from __future__ import annotations

import argparse
import json
import sys

from alpineagents.store import open_store


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="alpineagents",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="the saved States, newest first")
    listing.add_argument("store")
    show = commands.add_parser("show", help="one State's history")
    show.add_argument("store")
    show.add_argument("id")
    show.add_argument("--json", action="store_true", help="print the entries as JSON lines")
    delete = commands.add_parser("delete", help="remove a State")
    delete.add_argument("store")
    delete.add_argument("id")
    args = parser.parse_args(argv)

    store = open_store(args.store)
    try:
        if args.command == "list":
            for saved in store.list():
                print(
                    f"{saved.id}\t{saved.updated_at.isoformat()}\t"
                    f"{saved.stopped_by or '-'}\t{saved.task}"
                )
        elif args.command == "show":
            state = store.load(args.id)
            for entry in state.history:
                if args.json:
                    print(
                        json.dumps(
                            {
                                "seq": entry.seq,
                                "kind": entry.kind,
                                "text": entry.text,
                                "data": entry.data,
                            },
                            ensure_ascii=False,
                        )
                    )
                else:
                    print(f"{entry.seq:>4} {entry.kind:<11} {entry.text}")
        else:
            store.delete(args.id)
    except KeyError as e:
        print(f"alpineagents: {e}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
