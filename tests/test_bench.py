"""The benchmarks as a user runs them: a short run of bench/s3_bench.py, its figures holding
the protocol's costs; and the latency proxy they run behind."""

from __future__ import annotations

import json

import boto3
import pytest

from tests.helpers import bench_module, run_bench


@pytest.mark.slow
def test_a_short_bench_run_prints_the_costs_the_protocol_promises() -> None:
    done = run_bench(
        "s3_bench.py",
        *("--entries", "100", "--states", "30", "--repeat", "2", "--turns", "2"),
        *("--limit", "3", "--spaced", "4", "--json"),
        timeout=600,
    )
    figures = json.loads(done.stdout)
    (group,) = figures["resume"]
    rows = {row["row"]: row for row in group}
    cold, warm = rows["S3Store, cold"], rows["S3Store, warm"]
    assert cold["rounds"] == 2 and cold["requests"]["GET"] <= 1 + 15  # the head, then parts
    assert warm["rounds"] == 1 and warm["requests"] == {"GET": 1}  # 304: nothing changed
    assert rows["bound: 1 GET, no checks"]["requests"] == {"GET": 1}
    assert cold["entries"] == warm["entries"] >= 99

    turn = figures["turn"]  # a tool-using turn: 4 saves of an entry each
    assert turn["requests"] == {"PUT": 8}  # no GET, HEAD or LIST on the way
    (build,) = figures["build"]
    assert build["per_save"]["PUT"] <= 2.1 and set(build["per_save"]) <= {"PUT", "DELETE"}

    listing = {row["row"]: row for row in figures["list"]}
    assert listing["list()"]["requests"] == {"LIST": 1, "GET": 30}
    assert listing["list() again, by the same process"]["requests"] == {"LIST": 1}
    burst = listing["list(limit=3), all saved in a burst"]["requests"]
    assert burst["LIST"] == 1 and 3 <= burst["GET"] <= 30
    # Saved a second apart, the newest 3 are known from the listing's dates: 3 GETs, maybe 4.
    spaced = listing["list(limit=3), the newest 4 saved a second apart"]["requests"]
    assert spaced["LIST"] == 1 and 3 <= spaced["GET"] <= 4
    tidy = {row["row"]: row for row in figures["tidy"]}
    assert tidy["delete(), 1,067 entries"]["requests"]["LIST"] == 1
    assert tidy["sweep(), 50 States"]["requests"] == {"LIST": 2}  # nothing old to sweep


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
