"""bench/load_profile.py as a user runs it: its own moto and proxy, a small State, every phase.

The script's figures are CPU times on a shared machine, so only their shape is checked: each
phase is printed for each State, and the parts are not more than the whole they belong to.
"""

from __future__ import annotations

import re
from itertools import takewhile

import pytest

from tests.helpers import run_bench

PROXY_DELAY_MS = 20  # bench/latency_proxy.py's default


@pytest.mark.parametrize("first", [False, True], ids=["loaded-again", "first-load"])
def test_the_profile_prints_every_phase_of_each_load(first: bool) -> None:
    options = ["--first-load"] if first else []
    done = run_bench(
        "load_profile.py", "--n", "60", "--repeat", "2", "--unpacked", *options, timeout=180
    )
    printed = done.stdout
    for state_id in ("kept", "removed", "unpacked"):
        # The lines of this State's phases: indented, under its "<id>: wall ..." line.
        after = printed.split(f"{state_id}: wall ", 1)[1].splitlines()[1:]
        block = "\n".join(takewhile(lambda line: line.startswith("  "), after))
        if first and state_id != "unpacked":
            # A first load of a packed State lists its segments, then fetches them: two
            # rounds through the proxy (20 ms each); loaded again, the segments come with
            # the snapshot in one.
            fastest = re.search(rf"^{state_id}: wall [\d.]+ ms \(min ([\d.]+)\)", printed, re.M)
            assert fastest and float(fastest[1]) >= 2 * PROXY_DELAY_MS * 0.95, printed
        cpu = {
            label.strip(): float(figure)
            for label, figure in re.findall(r"^ +(\S.*?) +(-?[\d.]+) ms CPU per load$", block, re.M)
        }
        assert set(cpu) == {
            "S3Store.read (all threads)",
            "loads_segment (threads)",
            "of which the JSON parse",
            "Store._loaded (rebuild)",
            "of which state_from_record",
            "the rest of the load",
        }, block
        # The segment was parsed (a State of 60 entries packs into one segment; the unpacked
        # one has none), and the parts are within their whole (thread CPU within the
        # process's, a little slack).
        if state_id == "unpacked":
            assert cpu["loads_segment (threads)"] == 0
        else:
            assert cpu["loads_segment (threads)"] > 0
        assert cpu["of which the JSON parse"] <= cpu["loads_segment (threads)"] + 0.5
        assert cpu["of which state_from_record"] <= cpu["Store._loaded (rebuild)"] + 0.5
        collected = re.search(
            r"^  garbage collections +([\d.]+) ms per load \((.*)\)$", block, re.M
        )
        assert collected, block
        generations = re.findall(r"gen (\d): [\d.]+ in [\d.]+ ms", collected[2])
        assert generations == ["0", "1", "2"], collected[0]
