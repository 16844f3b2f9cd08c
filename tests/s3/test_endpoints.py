"""The endpoints of the store's requests, resolved through botocore's cache (``_endpoints``).

What could break, and is tried here: a parameter left out that a rule reads, so that two
requests get one endpoint where botocore gives each its own (a ``{Key}`` template, a ``ref``);
an endpoint or an error that differs from botocore's for some configuration (a region, FIPS,
dual-stack, acceleration, path or virtual addressing, an endpoint URL, a dotted bucket, an
access point, a directory bucket, a bad ARN); the cache still missed for every key, in sync or
async; the change reaching the other clients of the user's session or a ``client=``; a second
call wrapping the provider twice; a client built otherwise failing the store.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import aioboto3
import boto3
import botocore.endpoint_provider
import pytest
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointProviderError
from botocore.loaders import create_loader

from alpineagents import State
from alpineagents_s3 import S3Store
from alpineagents_s3._endpoints import UnkeyedProvider, cache_endpoints, unused_parameters
from tests.helpers import Mode
from tests.s3.helpers import Stores, load, save


def provider_of(client: Any) -> Any:
    return client._ruleset_resolver._provider


def test_the_s3_ruleset_never_names_key_nor_copy_source() -> None:
    """Pinned for the botocore installed: if a later one reads ``Key``, this says so."""
    client = boto3.Session().client("s3", region_name="us-east-1")
    unused = unused_parameters(provider_of(client).ruleset)
    assert unused == {"Key": str, "CopySource": str}
    # (Bucket, Region, Endpoint, ForcePathStyle, ... are named; Prefix is part of the name
    # "regionPrefix": kept, to be safe)


def ruleset(url: str, conditions: Any = (), documentation: str = "-", **other: Any) -> Any:
    """A provider of one endpoint rule with ``url``, over the parameters Bucket, Key, Other
    (whose definition ``other`` adds to)."""
    parameters = {
        name: {"type": "String", "required": False, "documentation": "-"}
        for name in ("Bucket", "Key", "Other")
    }
    parameters["Other"].update(other)
    rule = {"type": "endpoint", "conditions": list(conditions), "endpoint": {"url": url}}
    data = {
        "version": "1.0",
        "parameters": parameters,
        "rules": [{**rule, "documentation": documentation}],
    }
    partitions = create_loader().load_data("partitions")
    return botocore.endpoint_provider.EndpointProvider(data, partitions)


@pytest.mark.parametrize(
    ("url", "conditions", "documentation", "unused"),
    [
        ("https://{Key}.example.com", (), "-", {"Bucket", "Other"}),
        (
            "https://{Bucket}.example.com",
            [{"fn": "isSet", "argv": [{"ref": "Key"}]}],
            "-",
            {"Other"},
        ),
        ("https://{Bucket}.example.com", (), "names no Keys", {"Other"}),
    ],
    ids=["template", "ref", "in-a-longer-word"],
)
def test_a_parameter_the_rules_name_is_kept(
    url: str, conditions: Any, documentation: str, unused: set[str]
) -> None:
    provider = ruleset(url, conditions, documentation)
    assert set(unused_parameters(provider.ruleset)) == unused
    unkeyed = UnkeyedProvider(provider, unused_parameters(provider.ruleset))
    for key in ("a", "b"):
        params = {"Bucket": "b", "Key": key, "Other": key}
        assert unkeyed.resolve_endpoint(**params) == provider.resolve_endpoint(**params)


@pytest.mark.parametrize(
    "definition",
    [{"required": True}, {"deprecated": {"message": "gone", "since": "2026"}}],
    ids=["required", "deprecated"],
)
def test_a_parameter_botocore_checks_before_any_rule_is_kept(definition: Any) -> None:
    """botocore refuses a required parameter that is missing, and logs a deprecated one."""
    provider = ruleset("https://{Bucket}.example.com", **definition)
    assert set(unused_parameters(provider.ruleset)) == {"Key"}


@pytest.mark.parametrize(
    "other", [123, {"a": 1}, b"bytes", ["k"], True], ids=["int", "dict", "bytes", "list", "bool"]
)
def test_a_value_of_the_wrong_type_is_refused_as_botocore_refuses_it(other: Any) -> None:
    provider = ruleset("https://{Bucket}.example.com")
    unkeyed = UnkeyedProvider(provider, unused_parameters(provider.ruleset))
    assert "Other" in unused_parameters(provider.ruleset)

    def outcome(resolver: Any) -> tuple[str, str]:
        try:
            return ("endpoint", resolver.resolve_endpoint(Bucket="b", Other=other).url)
        except Exception as e:  # noqa: BLE001 - what each raises is compared
            return (type(e).__name__, str(e))

    assert outcome(unkeyed) == outcome(provider)
    assert outcome(unkeyed)[0] != "endpoint"


def test_an_endpoint_not_found_is_botocore_s_error_to_the_letter() -> None:
    provider = ruleset(
        "https://{Bucket}.example.com", [{"fn": "isSet", "argv": [{"ref": "Bucket"}]}]
    )
    unkeyed = UnkeyedProvider(provider, unused_parameters(provider.ruleset))
    errors = []
    for resolver in (unkeyed, provider):
        with pytest.raises(EndpointProviderError) as raised:
            resolver.resolve_endpoint(Key="k", Other="o")
        errors.append(str(raised.value))
    assert errors[0] == errors[1]
    assert "Key: k" in errors[0]


def test_the_provider_can_be_copied() -> None:
    client = boto3.Session().client("s3", region_name="us-east-1")
    cache_endpoints(client)
    for copied in (copy.copy(provider_of(client)), copy.deepcopy(provider_of(client))):
        assert isinstance(copied, UnkeyedProvider)
        assert copied.resolve_endpoint(Bucket="b", Region="us-east-1", Key="k").url


def test_a_parameter_the_rules_do_not_name_is_left_out_of_the_cache_s_key() -> None:
    provider = ruleset("https://{Bucket}.example.com")
    unkeyed = UnkeyedProvider(provider, unused_parameters(provider.ruleset))
    evaluated = counted(provider.ruleset)
    urls = {unkeyed.resolve_endpoint(Bucket="b", Key=f"k{n}").url for n in range(5)}
    assert urls == {"https://b.example.com"}
    assert len(evaluated) == 1


def counted(rules: Any) -> list[dict[str, Any]]:
    """Record the parameters of each evaluation of ``rules`` (a botocore ``RuleSet``)."""
    seen: list[dict[str, Any]] = []
    evaluate = rules.evaluate

    def recording(input_parameters: dict[str, Any]) -> Any:
        seen.append(dict(input_parameters))
        return evaluate(input_parameters)

    rules.evaluate = recording
    return seen


CONFIGS: dict[str, dict[str, Any]] = {
    "us-east-1": {"region_name": "us-east-1"},
    "eu-west-1": {"region_name": "eu-west-1"},
    "path": {"region_name": "eu-west-1", "config": Config(s3={"addressing_style": "path"})},
    "virtual": {"region_name": "eu-west-1", "config": Config(s3={"addressing_style": "virtual"})},
    "fips": {"region_name": "us-west-2", "config": Config(use_fips_endpoint=True)},
    "dualstack": {"region_name": "us-west-2", "config": Config(use_dualstack_endpoint=True)},
    "accelerate": {
        "region_name": "us-west-2",
        "config": Config(s3={"use_accelerate_endpoint": True}),
    },
    "endpoint-url": {"region_name": "us-east-1", "endpoint_url": "http://127.0.0.1:9000"},
    "global": {"region_name": "aws-global"},
}
BUCKETS = [
    "plain-bucket",
    "dotted.bucket.name",
    "arn:aws:s3:us-west-2:123456789012:accesspoint/my-point",
    "arn:aws:s3:us-west-2:123456789012:bad",
    "runs--usw2-az1--x-s3",
]
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("GetObject", {"Key": "runs/a/entries/g/0000000001.json"}),
    ("GetObject", {"Key": "runs/b/snapshot.json"}),
    ("PutObject", {"Key": "runs/a/entries/g/0000000002.json"}),
    ("HeadObject", {"Key": "runs/c/snapshot.json"}),
    ("ListObjectsV2", {"Prefix": "runs/a/"}),
    ("CopyObject", {"Key": "x/snapshot.json", "CopySource": "plain-bucket/runs/a/snapshot.json"}),
    ("DeleteObjects", {"Delete": {"Objects": [{"Key": "runs/a/snapshot.json"}]}}),
    ("GetObject", {"Key": 123}),  # of the wrong type: botocore's error
    ("GetObject", {"Key": {"not": "a key"}}),
]


def resolved(client: Any, operation: str, args: dict[str, Any]) -> Any:
    """What the client's resolver gives for a call: the endpoint, or the error's text."""
    model = client.meta.service_model.operation_model(operation)
    try:
        endpoint = client._ruleset_resolver.construct_endpoint(model, args, {})
    except (BotoCoreError, ClientError, ValueError, TypeError) as e:
        return ("error", type(e).__name__, str(e))
    return endpoint.url, endpoint.headers, json.dumps(endpoint.properties, sort_keys=True)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_every_endpoint_and_error_is_botocore_s(config: dict[str, Any]) -> None:
    session = boto3.Session()
    plain = session.client("s3", **config)
    cached = session.client("s3", **config)
    cache_endpoints(cached)
    assert isinstance(provider_of(cached), UnkeyedProvider)
    for bucket in BUCKETS:
        for operation, args in CALLS:
            call = {"Bucket": bucket, **args}
            # Twice: the second time from the cache, after the other keys of the loop.
            for _ in range(2):
                assert resolved(cached, operation, call) == resolved(plain, operation, call), (
                    bucket,
                    operation,
                )


class SentError(Exception):
    """Raised in place of sending a request, with it."""


@pytest.mark.parametrize("config", ["eu-west-1", "path", "dualstack", "endpoint-url"])
def test_the_requests_go_where_botocore_sends_them(config: str) -> None:
    session = boto3.Session()
    plain = session.client("s3", **CONFIGS[config])
    cached = session.client("s3", **CONFIGS[config])
    cache_endpoints(cached)

    def sent(client: Any) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []

        def stop(request: Any, **_: Any) -> None:
            out.append((request.url, request.headers.get("host", "")))
            raise SentError

        client.meta.events.register("before-send.s3", stop)
        for key in ("runs/a/snapshot.json", "runs/a/entries/g/0000000007.json", "other"):
            for bucket in ("plain-bucket", "dotted.bucket.name"):
                with pytest.raises(SentError):
                    client.get_object(Bucket=bucket, Key=key)
        return out

    assert sent(cached) == sent(plain)


def saved(stores: Stores, state_id: str, n: int) -> State:
    state = State("endpoints", id=state_id)
    for i in range(n):
        state.add_user_message(f"message {i}")
    stores.new().save(state)
    return state


@pytest.fixture
def evaluations(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The parameters of every evaluation of an endpoint ruleset in the process from now on."""
    seen: list[dict[str, Any]] = []
    evaluate = botocore.endpoint_provider.RuleSet.evaluate

    def recording(self: Any, input_parameters: dict[str, Any]) -> Any:
        seen.append(dict(input_parameters))
        return evaluate(self, input_parameters)

    monkeypatch.setattr(botocore.endpoint_provider.RuleSet, "evaluate", recording)
    return seen


async def test_a_load_evaluates_the_ruleset_once_not_once_a_key(
    mode: Mode, stores: Stores, evaluations: list[dict[str, Any]]
) -> None:
    state = saved(stores, "twenty", 20)  # 20 entry objects, one GET each
    store = stores.new()
    evaluations.clear()
    assert (await load(store, mode, state.id)).history == state.history
    with_keys = [e for e in evaluations if "Key" in e]
    assert with_keys == []
    # The GETs and PUTs of the store object: one evaluation, whatever the key.
    gets_and_puts = [e for e in evaluations if "Prefix" not in e]
    assert len(gets_and_puts) <= 1
    evaluations.clear()
    loaded = await load(store, mode, state.id)
    for i in range(3):
        loaded.add_user_message(f"more {i}")
        await save(store, mode, loaded)  # an entry PUT and a snapshot PUT each
    assert [e for e in evaluations if "Key" in e] == []
    assert len([e for e in evaluations if "Prefix" not in e]) <= 1


async def test_other_clients_of_the_session_and_a_given_client_are_left_as_they_are(
    stores: Stores, evaluations: list[dict[str, Any]]
) -> None:
    session = boto3.Session()
    state = saved(stores, "others", 3)
    store = stores.new(session=session)
    assert store.load(state.id).history == state.history
    assert isinstance(provider_of(store.client), UnkeyedProvider)
    own = session.client("s3", endpoint_url=stores.url)
    assert not isinstance(provider_of(own), UnkeyedProvider)
    evaluations.clear()
    given = S3Store(stores.bucket, "runs", client=own)
    try:
        assert given.load(state.id).history == state.history
    finally:
        given.close()
    assert not isinstance(provider_of(own), UnkeyedProvider)
    keys = {e["Key"] for e in evaluations if "Key" in e}
    assert len(keys) >= 4  # the snapshot and the 3 entries, each evaluated as botocore does


async def test_other_clients_of_a_given_aio_session_are_left_as_they_are(
    stores: Stores, evaluations: list[dict[str, Any]]
) -> None:
    aio = aioboto3.Session()
    state = saved(stores, "others-aio", 3)
    store = stores.new(aio_session=aio)
    assert (await store.aload(state.id)).history == state.history
    assert [e for e in evaluations if "Key" in e] == []
    async with aio.client("s3", endpoint_url=stores.url) as own:
        assert not isinstance(provider_of(own), UnkeyedProvider)
        await own.head_object(Bucket=stores.bucket, Key=f"runs/{state.id}/snapshot.json")
    assert [e["Key"] for e in evaluations if "Key" in e] == [f"runs/{state.id}/snapshot.json"]


def test_a_second_call_does_not_wrap_twice() -> None:
    client = boto3.Session().client("s3", region_name="us-east-1")
    cache_endpoints(client)
    first = provider_of(client)
    cache_endpoints(client)
    assert provider_of(client) is first
    assert not isinstance(first.provider, UnkeyedProvider)


@pytest.mark.parametrize(
    "client",
    [object(), type("NoRules", (), {"_ruleset_resolver": None})()],
    ids=["no-resolver", "none"],
)
def test_a_client_built_otherwise_is_left_as_it_is(client: Any) -> None:
    before = dict(vars(client)) if hasattr(client, "__dict__") else None
    cache_endpoints(client)
    assert (dict(vars(client)) if hasattr(client, "__dict__") else None) == before


def test_a_ruleset_that_cannot_be_written_out_is_left_as_it_is() -> None:
    client = boto3.Session().client("s3", region_name="us-east-1")
    provider = provider_of(client)
    loop: list[Any] = []
    loop.append(loop)
    provider.ruleset.rules.append(loop)  # a cycle: json.dumps refuses it
    try:
        cache_endpoints(client)
    finally:
        provider.ruleset.rules.pop()
    assert provider_of(client) is provider


async def test_the_async_client_of_another_event_loop_is_cached_too(
    stores: Stores, evaluations: list[dict[str, Any]]
) -> None:
    state = saved(stores, "loops", 5)
    store = stores.new()
    assert (await store.aload(state.id)).history == state.history

    def in_another_loop() -> None:
        async def go() -> None:
            assert (await store.aload(state.id)).history == state.history
            await store.aclose()  # the client of this loop

        asyncio.run(go())

    evaluations.clear()
    await asyncio.to_thread(in_another_loop)
    assert evaluations  # a new client: its cache is empty
    assert [e for e in evaluations if "Key" in e] == []
