"""Save and resume, end to end: a run is killed in the middle of a tool and resumed.

    python -m alpineagents.demo                 # offline: FileStore, a scripted model
    python -m alpineagents.demo --dir runs      # the same, keeping the runs in ./runs
    python -m alpineagents.demo --store s3      # the same on an embedded S3 server (moto)
    python -m alpineagents.demo --store s3://bucket/prefix   # a real bucket

Without --dir the FileStore is a temporary folder, removed when the demo ends. With --dir the
runs stay, and ``alpineagents ls runs`` lists them afterwards.

With ANTHROPIC_API_KEY set, Claude plays the model instead of the script.

The run books a flight. ``book_flight`` takes effect at once, then waits for a confirmation;
the demo kills the process (SIGKILL) while it waits. The resumed run, in a new process, finds
the call with the "(unknown: …)" result, checks the booking instead of booking again, and
finishes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from alpineagents import Agent, State, Store, open_store
from alpineagents.model import Model, ModelRequest
from alpineagents.store import ENTRY_POINT_GROUP
from alpineagents.testing import FunctionModel, call

STATE_ID = "book-oslo-trip"
TASK = "Book the cheapest flight to Oslo on 12 December for Ada Lovelace, then report the booking."
SYSTEM = (
    "You are a travel assistant. Use the tools. Never book a flight twice: when a booking's "
    "outcome is unknown, check it before booking again."
)


# The tools: a ledger file stands for the airline's booking system.


def _ledger() -> Path:
    return Path(os.environ["DEMO_LEDGER"])


def search_flights(destination: str, date: str) -> list[dict[str, Any]]:
    """Find flights to a destination on a date (YYYY-MM-DD)."""
    return [
        {"flight": "SK4711", "destination": destination, "date": date, "price_eur": 129},
        {"flight": "DY1302", "destination": destination, "date": date, "price_eur": 149},
    ]


def book_flight(flight: str, passenger: str) -> str:
    """Book a seat on a flight for a passenger. Charges the card: never call it twice."""
    reference = f"BK-{flight}"
    with _ledger().open("a") as ledger:
        ledger.write(
            json.dumps({"booked": flight, "passenger": passenger, "ref": reference}) + "\n"
        )
    time.sleep(float(os.environ.get("DEMO_CONFIRM_SECONDS", "0")))  # waiting for the airline
    return f"Booked {flight} for {passenger}, reference {reference}"


def check_booking(passenger: str) -> str:
    """List the bookings the airline has for a passenger."""
    found = (
        [
            json.loads(line)
            for line in _ledger().read_text().splitlines()
            if json.loads(line)["passenger"] == passenger
        ]
        if _ledger().exists()
        else []
    )
    return json.dumps(found) if found else "no bookings"


TOOLS: list[Callable[..., Any]] = [search_flights, book_flight, check_booking]


def scripted(request: ModelRequest) -> Any:
    """The offline model: what a careful assistant would do, step by step."""
    results = [
        block
        for message in request.messages
        if message["role"] == "user"
        for block in message["content"]
        if block["type"] == "tool_result"
    ]
    if not results:
        return [call("search_flights", destination="Oslo", date="2026-12-12")]
    last = results[-1]["content"]
    if last.startswith("[{") and "price_eur" in last:
        return [call("book_flight", flight="SK4711", passenger="Ada Lovelace")]
    if last.startswith("(unknown:"):
        return [call("check_booking", passenger="Ada Lovelace")]
    return [call("finish", answer=f"Done. The airline confirms: {last}")]


def make_model() -> Model | str:
    """Claude when ANTHROPIC_API_KEY is set, else the scripted model."""
    if os.environ.get("ANTHROPIC_API_KEY"):
        return os.environ.get("DEMO_MODEL", "claude-sonnet-5")
    return FunctionModel(scripted, name="scripted-demo-model")


def demo_support(store_url: str) -> Any | None:
    """What the store registered for the URL's scheme offers the demo, if anything.

    A plugin's store class may have a ``demo_support()`` class method returning an object with
    ``serve()`` (a context manager yielding a store URL), ``options(path)`` (store options that
    log the requests of a demo process to ``path``) and ``report(store, state_id, path)``.
    The core knows no plugin by name: it finds the class through the ``alpineagents.stores``
    entry points.
    """
    scheme = store_url.split("://", 1)[0] if "://" in store_url else store_url
    if not scheme or scheme == "file":
        return None
    found = entry_points(group=ENTRY_POINT_GROUP, name=scheme)
    if not found:
        return None
    support = getattr(next(iter(found)).load(), "demo_support", None)
    return support() if callable(support) else None


def child(store_url: str, state_id: str, resume: bool) -> None:
    """One process of the demo: start the run, or resume it."""
    support = demo_support(store_url)
    options = support.options(Path(os.environ["DEMO_REQUESTS"])) if support else {}
    store = open_store(store_url, **options)
    agent = Agent(make_model(), system=SYSTEM, tools=TOOLS, store=store)
    state = store.load(state_id) if resume else State(TASK, id=state_id)
    print(f"   answer: {agent.run(state)}", flush=True)


def free_id(store: Store) -> str:
    """The demo's State id, numbered when the store already has runs of earlier demos."""
    state_id, number = STATE_ID, 1
    while store.read(state_id) is not None:
        number += 1
        state_id = f"{STATE_ID}-{number}"
    return state_id


# The parent: runs the children and shows what happened.


def show(store: Store, state_id: str, title: str) -> None:
    """Print the demo State's history as the store has it."""
    state = store.load(state_id)
    print(f"\n== {title}: {len(state.history)} entries in history (store.load) ==")
    for entry in state.history:
        detail = entry.text
        if entry.kind == "model":
            calls = [b for b in entry.data["content"] if b["type"] == "tool_call"]
            detail = " + ".join(f"{c['name']}({json.dumps(c['input'])})" for c in calls) or detail
        marker = "  <- added when loaded" if entry.seq >= state._saved_count else ""
        print(f"   {entry.seq:>2} {entry.kind:<11} {_short(detail)}{marker}")


def _short(text: str, limit: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def run_demo(store_url: str, workdir: Path) -> str:
    """Start the run, kill it mid-tool, resume it in a new process, and show each stage.

    Returns the id of the State the demo ran.
    """
    env = {
        **os.environ,
        "DEMO_LEDGER": str(workdir / "airline-ledger.jsonl"),
        "DEMO_REQUESTS": str(workdir / "s3-requests.jsonl"),
        "DEMO_CONFIRM_SECONDS": "30",
    }
    model = "Claude" if os.environ.get("ANTHROPIC_API_KEY") else "an offline scripted model"
    state_id = free_id(open_store(store_url))
    print(f"Store: {store_url}\nModel: {model}\nTask:  {TASK}\nState: {state_id}")

    print("\n-- process 1 runs the agent; it is killed (SIGKILL) while book_flight waits --")
    first = subprocess.Popen(
        [sys.executable, "-m", "alpineagents.demo", "--child", store_url, "--id", state_id],
        env=env,
    )
    ledger = Path(env["DEMO_LEDGER"])
    deadline = time.monotonic() + 120
    while not ledger.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if first.poll() is not None:
        raise SystemExit(f"the first process ended before booking (exit {first.returncode})")
    time.sleep(0.3)
    first.send_signal(signal.SIGKILL)
    first.wait()
    print(
        f"   process 1 killed (exit {first.returncode}); bookings in the airline's ledger: "
        f"{len(ledger.read_text().splitlines())}"
    )

    store = open_store(store_url)
    show(store, state_id, "what was saved before the kill")

    print("\n-- process 2 loads the State and continues it --")
    env["DEMO_CONFIRM_SECONDS"] = "0"
    subprocess.run(
        [
            *(sys.executable, "-m", "alpineagents.demo", "--child", store_url),
            *("--id", state_id, "--resume"),
        ],
        env=env,
        check=True,
    )
    show(store, state_id, "after the resumed run")
    bookings = len(ledger.read_text().splitlines())
    print(
        f"\nbook_flight ran {bookings} time(s): the resumed run checked the booking "
        "instead of booking again."
        if bookings == 1
        else f"\nbook_flight ran {bookings} times."
    )
    support = demo_support(store_url)
    if support is not None and Path(env["DEMO_REQUESTS"]).exists():
        support.report(store, state_id, Path(env["DEMO_REQUESTS"]))
    return state_id


@contextlib.contextmanager
def demo_store(choice: str, workdir: Path, keep: Path | None) -> Iterator[str]:
    """The store URL for a --store choice, starting an embedded S3 server for "s3"."""
    if choice == "file":
        folder = keep if keep is not None else workdir / "agent-runs"
        folder.mkdir(parents=True, exist_ok=True)
        yield str(folder)
    elif re.fullmatch(r"[a-z][a-z0-9+.-]*", choice):  # a scheme alone ("s3"): its server
        support = demo_support(choice)
        if support is None:
            raise SystemExit(
                f"--store {choice}: no store plugin offers a demo server for {choice!r} "
                "(for S3: pip install './packaging/alpineagents-s3[testing]')"
            )
        with support.serve() as url:
            yield url
    else:
        yield choice


def where_the_runs_are(choice: str, url: str, state_id: str, kept: bool) -> str:
    """The closing lines: where the demo's runs are and the commands that list and show them."""
    if choice == "s3":
        return (
            "\nThe runs were in the embedded S3 server, which stopped with the demo. To keep "
            "them, run the demo with --dir DIR (a folder) or --store s3://BUCKET/PREFIX."
        )
    if choice == "file" and not kept:
        return (
            "\nThe runs were in a temporary folder, removed now. To keep them:\n"
            "   python -m alpineagents.demo --dir agent-runs\n"
            "   alpineagents ls agent-runs"
        )
    store = shlex.quote(url)
    return (
        f"\nThe runs are kept in {url}. List them, and show this one:\n"
        f"   alpineagents ls {store}\n"
        f"   alpineagents show {store} {state_id}"
    )


def main(argv: list[str] | None = None) -> None:
    """Run the demo (or, with --child, one of its processes)."""
    parser = argparse.ArgumentParser(
        prog="python -m alpineagents.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--store", default="file", help="file (default), s3 (embedded moto server) or a store URL"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        metavar="DIR",
        help="keep the runs in this folder (a FileStore) instead of a temporary one, so that "
        "`alpineagents ls DIR` lists them afterwards",
    )
    parser.add_argument("--child", metavar="STORE_URL", help=argparse.SUPPRESS)
    parser.add_argument("--id", default=STATE_ID, help=argparse.SUPPRESS)
    parser.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.id, args.resume)
        return
    if args.dir is not None and args.store != "file":
        parser.error("--dir names the folder of a FileStore: use it without --store")
    with (
        tempfile.TemporaryDirectory(prefix="alpineagents-demo-") as tmp,
        demo_store(args.store, Path(tmp), args.dir) as url,
    ):
        state_id = run_demo(url, Path(tmp))
    print(where_the_runs_are(args.store, url, state_id, kept=args.dir is not None))


if __name__ == "__main__":
    main()
