"""What parsing a packed segment costs, by JSON parser: the floor of a large packed load.

    python bench/json_parsers.py [--entries 10000] [--repeat 5]

One segment body of ``--entries`` entries (the entries of ``bench/table.py``, written as
``S3Store.pack`` writes them) is parsed by ``json.loads``, by pydantic_core's ``from_json``
as ``alpineagents_s3._codec`` calls it (``cache_strings=True``) and without the string
cache, and by orjson and msgspec when they are installed (neither is a dependency; a
missing one is named, not measured). Each figure is the least CPU time over ``--repeat``
parses. A load of the State also rebuilds it (``state_from_record``, in the core) and reads
the bytes over the network; see ``bench/load_profile.py`` for those.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import table  # noqa: E402  (the entries of the table)

from alpineagents import _serialize  # noqa: E402
from alpineagents_s3 import _codec  # noqa: E402


def least_cpu(parse: Callable[[], Any], repeat: int) -> float:
    """The least CPU time (seconds) of ``repeat`` calls of ``parse``."""
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        parse()
        best = min(best, time.process_time() - started)
    return best


def parsers(body: bytes) -> dict[str, Callable[[], Any] | str]:
    """Each parser as a call on ``body``, or why it is not measured."""
    found: dict[str, Callable[[], Any] | str] = {"json.loads": lambda: json.loads(body)}
    try:
        from pydantic_core import from_json
    except ImportError:
        found["pydantic_core.from_json"] = "not installed"
    else:
        found["pydantic_core.from_json (cache_strings, as S3Store)"] = lambda: from_json(
            body, allow_inf_nan=True, cache_strings=True
        )
        found["pydantic_core.from_json (no string cache)"] = lambda: from_json(
            body, allow_inf_nan=True, cache_strings=False
        )
    for name, call in (("orjson", "loads"), ("msgspec.json", "decode")):
        try:
            module = importlib.import_module(name)
        except ImportError:
            found[f"{name}.{call}"] = "not installed"
        else:
            found[f"{name}.{call}"] = functools.partial(getattr(module, call), body)
    return found


def main() -> None:
    """Print the parse time of one segment body by each parser."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=10_000, help="entries in the segment")
    parser.add_argument("--repeat", type=int, default=5, help="parses per parser")
    args = parser.parse_args()
    state = table.make_state(args.entries, "parsers")
    bodies = [_codec.dumps(_serialize.entry_to_dict(e), "an entry") for e in state.history]
    body = _codec.dumps_segment(0, bodies)
    print(f"one segment of {len(bodies):,} entries, {len(body) / 1e6:.2f} MB")
    for name, parse in parsers(body).items():
        if isinstance(parse, str):
            print(f"{name}: {parse}")
        else:
            print(f"{name}: {least_cpu(parse, args.repeat) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
