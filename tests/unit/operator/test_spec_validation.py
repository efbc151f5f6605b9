"""The DisaggregatedServing spec: every field parses under its camelCase name, defaults are the documented ones,
and every schema bound and cross-field rule refuses bad input with the message admission would report."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from dsv_cases import (
    ALLOW_TP,
    BOUNDS,
    DEFAULTS,
    ENUMS,
    FULL,
    FULL_ALT,
    QUANTITIES,
    REDIS,
    drop_none,
    field_paths,
    fmt,
    get_in,
    model_paths,
)
from dsv_helpers import doc, merge, spec, spec_dict

from duplex.api.naming import MAX_NAME, NAME_RULE
from duplex.api.spec import DisaggregatedServingSpec
from duplex.render import InvalidSpec, parse, parse_spec


def errors_of(body: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(body)
    assert info.value.errors, "InvalidSpec without errors"
    assert str(info.value) == "; ".join(info.value.errors)
    return info.value.errors


def assert_rejected(body: dict[str, Any], path: str, contains: str = "") -> str:
    errs = errors_of(body)
    hits = [e for e in errs if e.startswith(f"{path}: ") and contains in e]
    assert hits, f"no error at {path} containing {contains!r}: {errs}"
    return hits[0]


def doc_paths(d: Any, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        path = prefix + k
        out.add(path)
        if isinstance(v, dict):
            out |= doc_paths(v, path + ".")
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for item in v:
                out |= doc_paths(item, path + "[].")
    return out


# --- every field, under its API name ----------------------------------------------------------------------------


def test_minimal_spec_gets_the_documented_defaults() -> None:
    dumped = spec().model_dump(by_alias=True)
    assert dumped == DEFAULTS


@pytest.mark.parametrize("full", [FULL, FULL_ALT], ids=["pvc-url", "hostPath-urlSecret"])
def test_every_field_round_trips_under_its_camel_case_name(full: dict[str, Any]) -> None:
    parsed = parse_spec(copy.deepcopy(full))
    assert drop_none(parsed.model_dump(by_alias=True, exclude_unset=True)) == full
    assert parsed.kv_transfer.decode_blocks_ttl == full["kvTransfer"]["decodeBlocksTTL"]
    assert parsed.network.efa.hugepages2_mi == full["network"]["efa"]["hugepages2Mi"]


def test_the_full_examples_exercise_every_field_of_the_api() -> None:
    # A new field must be added to FULL (and so to these tests) before this passes again.
    pruned = {p for p in doc_paths(FULL) | doc_paths(FULL_ALT) if p in field_paths()}
    assert field_paths() - pruned == set()


def test_full_examples_differ_from_every_default() -> None:
    defaults = spec().model_dump(by_alias=True)
    for path in sorted(field_paths()):
        keys = tuple(path.split("."))
        if "[]" in path or keys[-1] == "connector":  # list items have no default; connector has one value
            continue
        values = []
        for full in (FULL, FULL_ALT):
            try:
                values.append(get_in(full, keys))
            except KeyError:
                pass
        try:
            default = get_in(defaults, keys)
        except TypeError:  # under an optional object that is unset by default
            default = None
        assert any(v != default for v in values), path


# --- schema bounds ----------------------------------------------------------------------------------------------


def at(path: str, value: Any) -> dict[str, Any]:
    out: Any = value
    for key in reversed(path.split(".")):
        out = {key: out}
    return out


def value_at(parsed: DisaggregatedServingSpec, path: str) -> Any:
    return get_in(parsed.model_dump(by_alias=True), tuple(path.split(".")))


@pytest.mark.parametrize("path,low,lowest,highest,high,extra", BOUNDS, ids=[b[0] for b in BOUNDS])
def test_numeric_bounds(path: str, low: Any, lowest: Any, highest: Any, high: Any, extra: dict[str, Any]) -> None:
    for ok in (lowest, highest):
        assert value_at(spec(merge(extra, at(path, ok))), path) == ok
    for bad in (low, high):
        assert_rejected(spec_dict(merge(extra, at(path, bad))), f"spec.{path}")


@pytest.mark.parametrize(
    "path",
    [
        "prefill.tensorParallelSize",
        "decode.tensorParallelSize",
        "prefill.accelerator.count",
        "router.service.port",
        "kvTransfer.sideChannelPort",
        "kvTransfer.decodeBlocksTTL",
        "kvTransfer.leaseDuration",
        "router.conversation.ttl",
        "network.efa.devicesPerPod",
        "router.maxBodyBytes",
        "router.store.maxEntries",
    ],
)
def test_zero_and_negative_rejected_where_a_positive_value_is_needed(path: str) -> None:
    for bad in (0, -1):
        assert_rejected(spec_dict(merge(ALLOW_TP, at(path, bad))), f"spec.{path}")


@pytest.mark.parametrize("path,bad,good", ENUMS, ids=[e[0] for e in ENUMS])
def test_enumerations(path: str, bad: Any, good: list[Any]) -> None:
    for value in good:
        assert value_at(spec(at(path, value)), path) == value
    assert_rejected(spec_dict(at(path, bad)), f"spec.{path}")


@pytest.mark.parametrize("path", QUANTITIES)
def test_quantity_fields_take_kubernetes_quantities_only(path: str) -> None:
    for ok in ("1", "500m", "0.5", "1Gi", "1024Mi", "64G", "2k"):
        assert value_at(spec(at(path, ok)), path) == ok
    for bad in ("1GB", "-1", "lots", "1.5.0", "", " 1Gi", "1 Gi"):
        assert_rejected(spec_dict(at(path, bad)), f"spec.{path}")


def test_quantity_given_as_a_yaml_number_is_rejected() -> None:
    # The CRD types quantities as strings; a bare YAML number must be quoted (as the examples do).
    assert_rejected(spec_dict({"prefill": {"cpu": 96}}), "spec.prefill.cpu")


@pytest.mark.parametrize(
    "path,bad",
    [
        ("model.name", ""),
        ("model.name", "x" * 1025),
        ("model.servedModelName", ""),
        ("model.image", ""),
        ("router.image", ""),
        ("model.hfTokenSecret.name", ""),
        ("model.cache.hostPath.path", "relative/dir"),
        ("model.cache.mountPath", "models"),
        ("router.store.redis.url", "http://redis:6379"),
        ("router.conversation.tenantHeader", ""),
        ("prefill.priorityClassName", "p" * 254),
        ("prefill.nodeSelector.pool", "v" * 64),
        ("network.efa.libraryPath", "/" * 4097),
    ],
)
def test_string_constraints(path: str, bad: str) -> None:
    base = {}
    if path.startswith("model.cache.hostPath"):
        base = {"model": {"cache": {"hostPath": {"path": "/ok"}}}}
    elif path == "model.cache.mountPath":
        base = {"model": {"cache": {"pvc": {"claimName": "c"}}}}
    elif path.startswith("model.hfTokenSecret"):
        base = {"model": {"hfTokenSecret": {"name": "n", "key": "k"}}}
    elif path.startswith("router.store.redis"):
        base = REDIS
    body = spec_dict(merge(base, at(path, bad)))
    assert_rejected(body, f"spec.{path}")


def test_required_fields() -> None:
    assert_rejected({}, "spec.model", "Field required")
    assert_rejected({"model": {}}, "spec.model.name", "Field required")
    assert_rejected(
        spec_dict({"model": {"hfTokenSecret": {"name": "n"}}}), "spec.model.hfTokenSecret.key", "Field required"
    )
    assert_rejected(spec_dict({"model": {"cache": {"pvc": {}}}}), "spec.model.cache.pvc.claimName", "Field required")
    assert_rejected(spec_dict({"model": {"env": [{"value": "x"}]}}), "spec.model.env[0].name", "Field required")


@pytest.mark.parametrize("name", ["A", "a.b", "a_b", "MY_VAR", "-x", "x-1", ".dot"])
def test_env_names_accepted(name: str) -> None:
    assert spec({"decode": {"env": [{"name": name, "value": "1"}]}}).decode.env[0].name == name


@pytest.mark.parametrize("name", ["", "1abc", "a b", "a=b", "a/b", "x" * 257])
def test_env_names_rejected(name: str) -> None:
    assert_rejected(spec_dict({"decode": {"env": [{"name": name, "value": "1"}]}}), "spec.decode.env[0].name")


def test_list_length_limits() -> None:
    assert_rejected(spec_dict({"model": {"extraArgs": ["--x"] * 65}}), "spec.model.extraArgs")
    assert_rejected(spec_dict({"model": {"extraArgs": ["x" * 1025]}}), "spec.model.extraArgs[0]")
    assert_rejected(spec_dict({"prefill": {"env": [{"name": f"E{i}"} for i in range(129)]}}), "spec.prefill.env")
    assert_rejected(spec_dict({"decode": {"tolerations": [{}] * 33}}), "spec.decode.tolerations")
    assert_rejected(
        spec_dict({"decode": {"topologySpreadConstraints": [{}] * 17}}), "spec.decode.topologySpreadConstraints"
    )
    assert len(spec({"model": {"extraArgs": ["--x"] * 64}}).model.extra_args) == 64


# --- unknown fields ---------------------------------------------------------------------------------------------

OBJECT_PATHS = sorted({p for p, _ in model_paths()}, key=lambda p: (len(p), [str(x) for x in p]))


def test_every_api_object_is_covered_by_the_unknown_field_cases() -> None:
    for path in OBJECT_PATHS:
        for full in (FULL, FULL_ALT):
            try:
                get_in(full, path)
                break
            except (KeyError, IndexError):
                pass
        else:
            pytest.fail(f"no full example holds {fmt(path)}")
    assert len(OBJECT_PATHS) >= 20


@pytest.mark.parametrize("path", OBJECT_PATHS, ids=[fmt(p) for p in OBJECT_PATHS])
def test_unknown_field_rejected_at_every_level(path: tuple[Any, ...]) -> None:
    for full in (FULL, FULL_ALT):
        body = copy.deepcopy(full)
        try:
            target = get_in(body, path)
        except (KeyError, IndexError):
            continue
        target["bogusField"] = 1
        err = assert_rejected(body, fmt(path + ("bogusField",)))
        assert err == f'{fmt(path + ("bogusField",))}: unknown field "bogusField"'
        return
    pytest.fail("path not in the examples")


def test_pass_through_kubernetes_objects_keep_unknown_fields() -> None:
    parsed = spec(
        {
            "prefill": {"affinity": {"futureField": {"x": 1}}, "tolerations": [{"anything": True}]},
            "model": {"env": [{"name": "E", "valueFrom": {"newSource": {"k": "v"}}}]},
        }
    )
    assert parsed.prefill.affinity == {"futureField": {"x": 1}}
    assert parsed.prefill.tolerations == [{"anything": True}]
    assert parsed.model.env[0].value_from == {"newSource": {"k": "v"}}


# --- cross-field rules ------------------------------------------------------------------------------------------

TP_MESSAGE = (
    "decode.tensorParallelSize must be >= prefill.tensorParallelSize (NixlConnector limitation); "
    "set kvTransfer.allowDecodeTPBelowPrefill to override"
)
TTL_MESSAGE = (
    "router.conversation.ttl must be strictly below kvTransfer.decodeBlocksTTL, "
    "or the router would replay blocks decode has already freed"
)
EFA_MESSAGE = (
    "network.efa.enabled needs prefill.memory and decode.memory: Kubernetes requires a memory request beside hugepages"
)


@pytest.mark.parametrize("ttl,blocks_ttl", [(480, 480), (481, 480), (600, 480), (60, 60), (86400, 60)])
def test_router_ttl_at_or_above_decode_blocks_ttl_rejected(ttl: int, blocks_ttl: int) -> None:
    body = spec_dict({"router": {"conversation": {"ttl": ttl}}, "kvTransfer": {"decodeBlocksTTL": blocks_ttl}})
    assert errors_of(body) == [f"spec: {TTL_MESSAGE}"]


@pytest.mark.parametrize("ttl,blocks_ttl", [(479, 480), (1, 60), (59, 60), (86399, 86400)])
def test_router_ttl_below_decode_blocks_ttl_accepted(ttl: int, blocks_ttl: int) -> None:
    parsed = spec({"router": {"conversation": {"ttl": ttl}}, "kvTransfer": {"decodeBlocksTTL": blocks_ttl}})
    assert (parsed.router.conversation.ttl, parsed.kv_transfer.decode_blocks_ttl) == (ttl, blocks_ttl)


def test_router_ttl_unset_accepted_with_any_decode_blocks_ttl() -> None:
    for blocks_ttl in (60, 480, 86400):
        assert spec({"kvTransfer": {"decodeBlocksTTL": blocks_ttl}}).router.conversation.ttl is None


@pytest.mark.parametrize("prefill,decode", [(2, 1), (8, 4), (64, 1), (16, 8)])
def test_decode_tp_below_prefill_tp_rejected(prefill: int, decode: int) -> None:
    body = spec_dict({"prefill": {"tensorParallelSize": prefill}, "decode": {"tensorParallelSize": decode}})
    assert errors_of(body) == [f"spec: {TP_MESSAGE}"]
    body["kvTransfer"] = {"allowDecodeTPBelowPrefill": True}
    assert parse_spec(body).decode.tensor_parallel_size == decode


@pytest.mark.parametrize("prefill,decode", [(1, 1), (8, 8), (4, 8), (1, 64)])
def test_decode_tp_at_or_above_prefill_tp_accepted(prefill: int, decode: int) -> None:
    parsed = spec({"prefill": {"tensorParallelSize": prefill}, "decode": {"tensorParallelSize": decode}})
    assert (parsed.prefill.tensor_parallel_size, parsed.decode.tensor_parallel_size) == (prefill, decode)


@pytest.mark.parametrize("memory", [{}, {"prefill": {"memory": "1Gi"}}, {"decode": {"memory": "1Gi"}}])
def test_efa_without_role_memory_rejected(memory: dict[str, Any]) -> None:
    body = spec_dict(merge({"network": {"efa": {"enabled": True}}}, memory))
    assert errors_of(body) == [f"spec: {EFA_MESSAGE}"]


def test_efa_with_both_memories_accepted_and_memory_optional_without_efa() -> None:
    assert spec(
        {"network": {"efa": {"enabled": True}}, "prefill": {"memory": "1Gi"}, "decode": {"memory": "2Gi"}}
    ).network.efa.enabled
    assert spec({"network": {"efa": {"enabled": False}}}).prefill.memory is None


def test_router_replicas_above_one_need_redis() -> None:
    msg = "router.replicas above 1 needs router.store.type redis, so that replicas share conversation state"
    assert errors_of(spec_dict({"router": {"replicas": 2}})) == [f"spec.router: {msg}"]
    assert spec(merge(REDIS, {"router": {"replicas": 2}})).router.replicas == 2
    for replicas in (0, 1):
        assert spec({"router": {"replicas": replicas}}).router.replicas == replicas


def test_redis_store_needs_redis_settings() -> None:
    assert errors_of(spec_dict({"router": {"store": {"type": "redis"}}})) == [
        "spec.router.store: router.store.type redis needs router.store.redis"
    ]


@pytest.mark.parametrize("redis", [{}, {"url": "redis://r:6379", "urlSecret": {"name": "s", "key": "k"}}])
def test_redis_needs_exactly_one_of_url_and_url_secret(redis: dict[str, Any]) -> None:
    body = spec_dict({"router": {"store": {"type": "redis", "redis": redis}}})
    assert errors_of(body) == ["spec.router.store.redis: router.store.redis needs exactly one of url or urlSecret"]


@pytest.mark.parametrize(
    "redis", [{"url": "redis://r:6379/0"}, {"url": "rediss://r:6380"}, {"urlSecret": {"name": "s", "key": "k"}}]
)
def test_redis_with_one_source_accepted(redis: dict[str, Any]) -> None:
    parsed = spec({"router": {"store": {"type": "redis", "redis": redis}}})
    assert parsed.router.store.redis is not None


@pytest.mark.parametrize("url", ["rediss://user:pw@r:6380", "redis://:pw@r:6379/0", "redis://default@r"])
def test_an_inline_redis_url_never_carries_credentials(url: str) -> None:
    # It would be rendered into the router's ConfigMap; urlSecret is the place for a password.
    body = spec_dict({"router": {"store": {"type": "redis", "redis": {"url": url}}}})
    assert errors_of(body) == [
        "spec.router.store.redis: router.store.redis.url must not carry credentials (user:password@): put the URL "
        "in a Secret and name it in urlSecret"
    ]


def test_conversation_keyed_by_id_needs_body_field_or_header() -> None:
    body = spec_dict({"router": {"conversation": {"keying": "id", "bodyField": "", "header": ""}}})
    assert errors_of(body) == [
        "spec.router.conversation: router.conversation.keying id needs bodyField or header to read the conversation id"
    ]
    # Keyed by history (or both, the default), a conversation needs no id at all.
    for keying in ("history", "both"):
        no_id = spec({"router": {"conversation": {"keying": keying, "bodyField": "", "header": ""}}})
        assert no_id.router.conversation.keying == keying
    assert spec({"router": {"conversation": {"bodyField": ""}}}).router.conversation.header == "X-Conversation-Id"
    assert spec({"router": {"conversation": {"header": ""}}}).router.conversation.body_field == "conversation_id"
    # An explicit null is pruned and re-defaulted, as the API server does.
    assert spec({"router": {"conversation": {"header": None}}}).router.conversation.header == "X-Conversation-Id"


@pytest.mark.parametrize("cache", [{}, {"pvc": {"claimName": "c"}, "hostPath": {"path": "/m"}}, {"mountPath": "/m"}])
def test_model_cache_needs_exactly_one_source(cache: dict[str, Any]) -> None:
    body = spec_dict({"model": {"cache": cache}})
    assert errors_of(body) == ["spec.model.cache: model.cache needs exactly one of pvc or hostPath"]


def test_model_cache_with_one_source_accepted() -> None:
    pvc = spec({"model": {"cache": {"pvc": {"claimName": "c"}}}}).model.cache
    assert pvc is not None and pvc.pvc is not None and pvc.pvc.read_only is True and pvc.mount_path == "/models"
    host = spec({"model": {"cache": {"hostPath": {"path": "/mnt/nvme"}}}}).model.cache
    assert host is not None and host.host_path is not None and host.host_path.path == "/mnt/nvme"


def test_rollout_needs_surge_or_unavailable() -> None:
    body = spec_dict({"decode": {"rollout": {"maxSurge": 0, "maxUnavailable": 0}}})
    assert errors_of(body) == ["spec.decode.rollout: rollout needs maxSurge or maxUnavailable above 0"]
    assert spec({"decode": {"rollout": {"maxSurge": 0, "maxUnavailable": 1}}}).decode.rollout.max_unavailable == 1


def test_several_independent_errors_are_all_reported() -> None:
    body = spec_dict({"prefill": {"replicas": -1}, "decode": {"bogus": 1}, "router": {"store": {"type": "redis"}}})
    errs = errors_of(body)
    assert any(e.startswith("spec.prefill.replicas: ") for e in errs)
    assert 'spec.decode.bogus: unknown field "bogus"' in errs
    assert "spec.router.store: router.store.type redis needs router.store.redis" in errs


def test_null_or_missing_spec_reports_the_missing_model() -> None:
    assert errors_of(None) == ["spec.model: Field required"]  # type: ignore[arg-type]


# --- the object: apiVersion, kind, metadata.name ----------------------------------------------------------------


NAME_MESSAGE = (
    f"metadata.name must be a DNS-1035 label of at most {MAX_NAME} characters "
    "(children are named <name>-prefill, <name>-decode, <name>-router)"
)


@pytest.mark.parametrize("name", ["a", "qwen3-32b", "a" * MAX_NAME, "x-1-y", "z0"])
def test_valid_names(name: str) -> None:
    assert parse(doc(spec_dict(), name=name)).name == name
    assert NAME_RULE.holds(name)


@pytest.mark.parametrize(
    "name", ["", "a" * (MAX_NAME + 1), "Qwen", "1model", "-a", "a-", "a_b", "a.b", "a b", "modèle"]
)
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse(doc(spec_dict(), name=name))
    assert info.value.errors == [NAME_MESSAGE]
    assert NAME_RULE.message == NAME_MESSAGE
    assert not NAME_RULE.holds(name)


def test_name_and_spec_errors_reported_together() -> None:
    with pytest.raises(InvalidSpec) as info:
        parse(doc(spec_dict({"prefill": {"replicas": -1}}), name="Bad_Name"))
    assert info.value.errors[0] == NAME_MESSAGE
    assert info.value.errors[1].startswith("spec.prefill.replicas: ")


def test_missing_metadata_is_an_invalid_name() -> None:
    body = doc(spec_dict())
    del body["metadata"]
    with pytest.raises(InvalidSpec) as info:
        parse(body)
    assert info.value.errors == [NAME_MESSAGE]


@pytest.mark.parametrize(
    "api_version,kind", [("duplex.dev/v1", "DisaggregatedServing"), ("duplex.dev/v1alpha1", "Deployment"), (None, None)]
)
def test_wrong_api_version_or_kind_rejected(api_version: Any, kind: Any) -> None:
    body = doc(spec_dict())
    body["apiVersion"], body["kind"] = api_version, kind
    with pytest.raises(InvalidSpec) as info:
        parse(body)
    assert "expected apiVersion duplex.dev/v1alpha1 kind DisaggregatedServing" in str(info.value)


def test_parse_keeps_namespace_and_generation_and_defaults_the_namespace() -> None:
    s = parse(doc(spec_dict(), name="n", namespace="team-a", generation=7))
    assert (s.name, s.namespace, s.generation) == ("n", "team-a", 7)
    assert parse(doc(spec_dict()), default_namespace="elsewhere").namespace == "elsewhere"
    assert parse(doc(spec_dict())).namespace == "default"
    assert parse(doc(spec_dict())).generation is None


def test_examples_parse(seed_doc: dict[str, Any], trainium_doc: dict[str, Any]) -> None:
    seed = parse(seed_doc)
    assert (seed.name, seed.spec.prefill.tensor_parallel_size, seed.spec.network.efa.enabled) == ("qwen3-32b", 8, True)
    trn = parse(trainium_doc)
    assert trn.spec.decode.accelerator.type == "aws.amazon.com/neuron"
    assert trn.spec.router.store.redis is not None and trn.spec.router.store.redis.url_secret is not None
