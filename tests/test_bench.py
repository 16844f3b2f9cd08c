"""A short run of bench/table.py: every store's rows are there and their figures hold together.

The run is the script as a user starts it (its own moto server and latency proxy, both real
processes), at N = 10, one timed load a row, one counted turn; the peer's virtualenv is
pointed at a folder that does not exist, so its rows must say "not installed".
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any

import boto3

from tests.helpers import bench_module, run_bench

DELAY_MS = 20


def run_table(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    figures = tmp_path / "figures.json"
    env = dict(os.environ, PEER_VENV=str(tmp_path / "no-peer"))
    done = run_bench(
        "table.py",
        *("--sizes", "10", "--repeat", "1", "--turns", "1"),
        *("--delay-ms", str(DELAY_MS), "--json", str(figures)),
        timeout=120,
        env=env,
    )
    loaded: dict[str, Any] = json.loads(figures.read_text())
    return done.stdout, loaded


def test_the_table_has_every_store_and_its_figures_hold_together(tmp_path: Path) -> None:
    printed, figures = run_table(tmp_path)
    rows = figures["rows"]
    size = figures["json_sizes"]["10"]
    by_key = {(r["store"], r["via"]): r for r in rows}

    # Every row the script promises, and the peer said to be missing rather than left out.
    for key in [
        ("floor: 1 GET of all", "proxy"),
        ("floor: 1 GET of all", "direct"),
        ("floor: read + json.loads", "disk"),
        ("FileStore", "disk"),
        ("S3Store", "proxy"),
        ("S3Store", "direct"),
    ]:
        assert key in by_key, f"no row {key}: {sorted(by_key)}"
    peer = by_key[("Strands S3SessionManager", "-")]
    assert peer["wall"] is None
    assert "not installed" in peer["note"]
    assert "not installed" in printed
    # The packed variants: the snapshot and one segment, the segments and the entries listed
    # (10 entry objects kept fit the first page), whether the store object read the State
    # before (one round) or not (two).
    for name in ("S3Store packed", "S3Store packed, first load", "S3Store packed, entries removed"):
        for via in ("proxy", "direct"):
            assert by_key[(name, via)]["requests"] == {"GET": 2, "LIST": 2}, (name, via)

    for (store, via), row in by_key.items():
        if row["wall"] is None:
            continue
        assert row["wall"] > 0 and row["cpu"] >= 0, (store, via)
        if via == "proxy":  # the proxy adds its delay to every request: at least one wait
            assert row["wall"] >= DELAY_MS / 1000 * 0.95, (store, via, row["wall"])
        if via != "disk":
            assert sum(row["requests"].values()) >= 1, (store, via)
        # Every store reads at least the history's bytes (as JSON, give or take the framing).
        assert row["read"] >= 0.9 * size, (store, via, row["read"], size)
    # The bound rows (bench/bound.py), counted by the same hooks as the stores: a head and one
    # part at N = 10, listed first or not; the whole history as one object.
    for via in ("proxy", "direct"):
        first = by_key[("bound: 2 rounds, no checks", via)]
        known = by_key[("bound: 1 round, no checks", via)]
        one = by_key[("bound: 1 GET, no checks", via)]
        assert first["requests"] == {"GET": 2, "LIST": 1}, (via, first)
        assert known["requests"] == {"GET": 2}, (via, known)
        assert one["requests"] == {"GET": 1}, (via, one)
        for row in (first, known, one):
            assert row["read"] <= 1.05 * size, (via, row["read"], size)
    # Through the proxy, a wait a round: the listing, then the parts.
    assert by_key[("bound: 2 rounds, no checks", "proxy")]["wall"] >= 2 * DELAY_MS / 1000 * 0.95

    floor = by_key[("floor: 1 GET of all", "proxy")]
    assert floor["requests"] == {"GET": 1}
    assert floor["read"] == size
    # The baseline keeps one object per entry: at least one GET per entry.
    assert by_key[("S3Store", "proxy")]["requests"]["GET"] >= 10
    assert by_key[("S3Store", "proxy")]["peak"] > 0

    turns = {t["store"]: t for t in figures["turns"]}
    assert turns["FileStore"]["sent"] > turns["FileStore"]["entries"] > 0
    assert turns["S3Store"]["requests"].get("PUT", 0) >= 1
    assert turns["S3Store"]["sent"] >= turns["S3Store"]["entries"] > 0
    assert "not installed" in turns["Strands S3SessionManager"]["note"]

    # The printed table is Markdown, one line per row, under one header.
    table = [line for line in printed.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| N | store | via | wall |")
    assert len([line for line in table if line.startswith("| 10 |")]) == len(rows)


def test_the_bound_cuts_parts_as_pack_cuts_segments() -> None:
    """bench/bound.py: the parts of a history are the segments a first pack writes of it."""
    from alpineagents_s3._packing import cut as cut_segments

    cut = bench_module("bound").cut
    kib = 1024
    for sizes in ([kib], [kib] * 1025, [kib] * 2100, [3 * kib] * 5000, [kib, 9 << 20, kib]):
        bodies = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
        parts = cut(bodies)
        assert [b for part in parts for b in part] == bodies  # every body once, in order
        ranges, at = [], 0
        for part in parts:
            ranges.append((at, at + len(part)))
            at += len(part)
        assert ranges == cut_segments(0, sizes), len(sizes)
    assert len(cut([b"x" * kib] * 1025)) == 1  # a remainder under 128 KiB joins the segment
    assert len(cut([b"x" * kib] * (15 << 10))) == 4  # 15 MiB: four of a quarter


def test_the_profile_counts_garbage_collections_by_generation() -> None:
    """bench/load_profile.py's Collections: a full collection counted as one of generation 2,
    none outside its block, and its callback gone after."""
    collections = bench_module("load_profile").Collections()
    with collections.counting():
        gc.collect()
    assert collections.count == [0, 0, 1] and collections.seconds[2] > 0
    assert collections._callback not in gc.callbacks
    gc.collect()
    assert collections.count == [0, 0, 1]
    assert "gen 2: 0.5 in" in collections.summary(2)


def test_the_proxy_answers_repeated_reads_and_listings_until_a_write(moto_url: str) -> None:
    with bench_module("latency_proxy").LatencyProxy(moto_url, 0.001) as proxy:
        client = boto3.client("s3", endpoint_url=proxy.url, region_name="us-east-1")
        client.create_bucket(Bucket="proxied")
        client.put_object(Bucket="proxied", Key="a", Body=b"1")

        def keys() -> list[str]:
            listed = client.list_objects_v2(Bucket="proxied", Prefix="")
            return [item["Key"] for item in listed.get("Contents", ())]

        assert keys() == ["a"] and client.get_object(Bucket="proxied", Key="a")["Body"].read()
        hits = proxy.stats.cache_hits
        assert keys() == ["a"] and client.get_object(Bucket="proxied", Key="a")["Body"].read()
        assert proxy.stats.cache_hits == hits + 2  # both answered from the proxy's memory
        client.put_object(Bucket="proxied", Key="b", Body=b"2")  # a write: listings are stale
        assert keys() == ["a", "b"]
        client.delete_objects(Bucket="proxied", Delete={"Objects": [{"Key": "b"}]})
        assert keys() == ["a"]
        client.delete_object(Bucket="proxied", Key="a")
        assert keys() == []
        assert proxy.stats.cache_hits == hits + 2


def test_the_tls_start_up_table_counts_the_bundle_loads() -> None:
    """A short run of bench/tls_startup.py: its rows, and the loads that tell the two apart."""
    done = run_bench("tls_startup.py", "--sizes", "10", "--repeat", "1", timeout=300)
    rows = {
        (cells[2], cells[3]): int(cells[6])
        for line in done.stdout.splitlines()
        if line.startswith("| 10 |") and (cells := [c.strip() for c in line.split("|")])
    }
    assert set(rows) == {(api, how) for api in ("sync", "async") for how in ("as botocore", "once")}
    # A cold sync load opens a connection per GET at once: one load each, or one in all.
    assert rows["sync", "as botocore"] > 1 and rows["sync", "once"] == 1, done.stdout
    # The async clients: one per client, or none once the process has it.
    assert rows["async", "as botocore"] == 1 and rows["async", "once"] == 0, done.stdout


def test_the_parser_figures_name_every_parser_and_what_is_missing() -> None:
    """A short run of bench/json_parsers.py: a figure for each parser installed, and a missing
    one named (this environment has neither orjson nor msgspec unless someone installed them)."""
    done = run_bench("json_parsers.py", "--entries", "50", "--repeat", "1", timeout=120)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("one segment of 50 entries, ")
    figures = dict(line.split(": ", 1) for line in lines[1:])
    assert set(figures) == {
        "json.loads",
        "pydantic_core.from_json (cache_strings, as S3Store)",
        "pydantic_core.from_json (no string cache)",
        "orjson.loads",
        "msgspec.json.decode",
    }, figures
    for name, figure in figures.items():
        assert figure == "not installed" or figure.endswith(" ms"), (name, figure)
        if figure != "not installed":
            assert float(figure.removesuffix(" ms")) >= 0
    assert figures["json.loads"] != "not installed"
