"""The generated CRD: structural, documented, carrying every model rule (same CEL, same message) where the model
sits, agreeing with the models on bounds and defaults, and identical to the committed crds/ file."""

from __future__ import annotations

import re
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from dsv_cases import BOUNDS, ENUMS, FULL, FULL_ALT, QUANTITIES, fmt, model_paths
from dsv_helpers import CRD_FILE as COMMITTED
from dsv_helpers import REPO, merge, spec_dict
from pydantic import BaseModel

from duplex.api.meta import GROUP, KIND, PLURAL, SHORT_NAME, SINGULAR, VERSION
from duplex.api.naming import NAME_RULE
from duplex.api.owned_args import OWNED_FLAGS
from duplex.api.pairing import PAIRED_ENV, PAIRED_FLAGS
from duplex.api.rules import Checked
from duplex.crd import crd, openapi_schema
from duplex.crd_cli import CRD_FILE
from duplex.crd_cli import main as crds_main
from duplex.render import InvalidSpec, parse_spec

ROOT = openapi_schema()
SPEC = ROOT["properties"]["spec"]


def schema_at(path: tuple[Any, ...], node: dict[str, Any] = SPEC) -> dict[str, Any]:
    for p in path:
        node = node["items"] if isinstance(p, int) else node["properties"][p]
    return node


def nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for k, v in (node.get("properties") or {}).items():
        yield from nodes(v, f"{path}.{k}")
    if isinstance(node.get("items"), dict):
        yield from nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from nodes(node["additionalProperties"], f"{path}{{}}")


# --- structure --------------------------------------------------------------------------------------------------


def test_top_level_shape() -> None:
    c = crd()
    assert c["apiVersion"] == "apiextensions.k8s.io/v1" and c["kind"] == "CustomResourceDefinition"
    assert c["metadata"]["name"] == f"{PLURAL}.{GROUP}" == "disaggregatedservings.duplex.dev"
    s = c["spec"]
    assert s["group"] == GROUP == "duplex.dev" and s["scope"] == "Namespaced"
    assert s["names"] == {
        "kind": KIND,
        "listKind": f"{KIND}List",
        "plural": PLURAL,
        "singular": SINGULAR,
        "shortNames": ["dsv"],
        "categories": ["duplex"],
    }
    assert SHORT_NAME == "dsv"
    [version] = s["versions"]
    assert (version["name"], version["served"], version["storage"]) == (VERSION, True, True) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    assert version["schema"]["openAPIV3Schema"] == ROOT


def test_printer_columns() -> None:
    columns = crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [(c["name"], c["type"], c["jsonPath"]) for c in columns] == [
        ("Ready", "string", '.status.conditions[?(@.type=="Ready")].status'),
        ("Prefill", "string", ".status.prefill.summary"),
        ("Decode", "string", ".status.decode.summary"),
        ("Bidirectional", "boolean", ".spec.kvTransfer.bidirectional"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]


FORBIDDEN = {"anyOf", "oneOf", "allOf", "not", "$ref", "$defs", "definitions", "title", "const", "discriminator"}


@pytest.mark.parametrize("part", ["spec", "status", "root"])
def test_schema_is_structural(part: str) -> None:
    root = ROOT if part == "root" else ROOT["properties"][part]
    for path, node in nodes(root):
        assert not FORBIDDEN & node.keys(), (path, FORBIDDEN & node.keys())
        preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path
        if node.get("type") == "object" and not preserve:
            assert "properties" in node or isinstance(node.get("additionalProperties"), dict) or path == ".metadata", (
                path
            )
        if node.get("type") == "array":
            assert isinstance(node.get("items"), dict) and "type" in node["items"], path
        assert node.get("additionalProperties", {}) not in (True, False), path
        for v in node.get("x-kubernetes-validations", []):
            assert set(v) <= {"rule", "message", "fieldPath"}, path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path
        if "required" in node:
            assert set(node["required"]) <= set(node["properties"]), path


def test_status_keeps_unknown_fields_and_spec_is_required() -> None:
    assert ROOT["required"] == ["spec"]
    assert ROOT["properties"]["status"]["x-kubernetes-preserve-unknown-fields"] is True
    assert ROOT["properties"]["metadata"] == {"type": "object"}
    status = ROOT["properties"]["status"]["properties"]
    assert {
        "prefill",
        "decode",
        "router",
        "conditions",
        "effectiveKV",
        "routerEndpoint",
        "engineConfigHash",
        "observedGeneration",
    } <= set(status)
    assert status["prefill"]["properties"]["summary"]["type"] == "string"


def test_kubernetes_objects_pass_through_unpruned() -> None:
    for path in [
        ("prefill", "affinity"),
        ("decode", "tolerations", 0),
        ("prefill", "topologySpreadConstraints", 0),
        ("model", "env", 0, "valueFrom"),
        ("router", "tolerations", 0),
    ]:
        node = schema_at(path)
        assert node["type"] == "object" and node["x-kubernetes-preserve-unknown-fields"] is True, path


def test_string_maps_are_typed() -> None:
    for path in [("prefill", "nodeSelector"), ("router", "nodeSelector"), ("router", "service", "annotations")]:
        node = schema_at(path)
        assert node["type"] == "object" and node["additionalProperties"]["type"] == "string", path


# --- documentation (kubectl explain) ----------------------------------------------------------------------------


def _class_fields() -> Iterator[tuple[tuple[Any, ...], str, Any]]:
    seen = set()
    for path, cls in model_paths():
        if path in seen:
            continue
        seen.add(path)
        for name, field in cls.model_fields.items():
            yield path, field.alias or name, field


def test_field_descriptions_come_from_the_models() -> None:
    checked = 0
    for path, alias, field in _class_fields():
        if field.description:
            assert schema_at(path)["properties"][alias]["description"] == field.description, fmt(path + (alias,))
            checked += 1
    assert checked > 80


def test_every_spec_field_is_documented_for_kubectl_explain() -> None:
    missing = [
        path for path, node in nodes(SPEC) if path and not node.get("description") and not path.endswith(("[]", "{}"))
    ]
    assert missing == []
    # list items that are API objects are documented too (kubectl explain shows them under the list field)
    assert schema_at(("model", "env", 0, "name"))["description"]


def test_object_descriptions_fall_back_to_class_docstrings() -> None:
    assert SPEC["description"].startswith("Desired state of a prefill-decode disaggregated vLLM deployment")
    assert schema_at(("model", "env", 0))["description"].startswith("An environment variable")
    assert ROOT["description"]


# --- rules ------------------------------------------------------------------------------------------------------

# For each model with RULES: one object-level patch per rule (in RULES order) that breaks exactly that rule.
VIOLATIONS: dict[str, list[dict[str, Any]]] = {
    "DisaggregatedServingSpec": [
        {"prefill": {"tensorParallelSize": 2}},
        {"network": {"efa": {"enabled": True}}},
        {"decode": {"accelerator": {"type": "aws.amazon.com/neuron"}}},
        {
            "prefill": {"accelerator": {"type": "cpu"}, "memory": "1Gi"},
            "decode": {"accelerator": {"type": "cpu"}, "memory": "1Gi"},
            "model": {"blockSize": 32},
            "network": {"efa": {"enabled": True}},
        },
        {"prefill": {"accelerator": {"type": "cpu"}}, "decode": {"accelerator": {"type": "cpu"}}},
        {"router": {"conversation": {"ttl": 480}}},
        {"decode": {"nodesPerInstance": 2, "tensorParallelSize": 2}},
    ],
    "Accelerator": [{"kvCacheGiB": 2}, {"type": "cpu", "count": 1}],
    "ModelCache": [{}],
    "RolloutSpec": [{"maxSurge": 0, "maxUnavailable": 0}],
    "ConversationSpec": [{"keying": "id", "bodyField": "", "header": ""}],
    "EnvVar": [{"name": "X", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    "KVTransferSpec": [{"recomputeThreshold": "auto"}, {"sideChannelPort": 8000}],
    "RecomputeCalibrationSpec": [{"initial": 8}],
    "RedisSpec": [{}, {"url": "redis://duplex:hunter2@redis:6379/0"}],
    "StoreSpec": [{"type": "redis"}],
    "RouterSpec": [{"memory": "128Mi"}, {"replicas": 2}, {"gateway": {"keys": ["envoy"]}}],
    "ScalingSpec": [{"minReplicas": 3, "maxReplicas": 2}],
    "RatioSpec": [{"min": 2.0, "max": 1.0}],
    "ModelSpec": [{"extraArgs": ["--enforce-eager", flags[0], "1"]} for flags, _ in OWNED_FLAGS],
    **{
        cls: [{"extraArgs": ["--enforce-eager", flags[0], "1"]} for flags, _ in (*OWNED_FLAGS, *PAIRED_FLAGS)]
        + [{"env": [{"name": "A", "value": "1"}, {"name": PAIRED_ENV[0], "value": "FLASH_ATTN"}]}]
        + [{"scaling": {"mode": "Automatic"}}]
        + [
            {"nodesPerInstance": 2, "accelerator": {"type": "aws.amazon.com/neuron"}},
            {"nodesPerInstance": 2, "tensorParallelSize": 2, "accelerator": {"count": 2}},
            {"nodesPerInstance": 2},
            {"instanceTopologyKey": "topology.k8s.aws/network-node-layer-3"},
        ]
        for cls in ("PrefillSpec", "DecodeSpec")
    },
}

RULE_LOCATIONS = [(path, cls) for path, cls in model_paths() if issubclass(cls, Checked) and cls.RULES]


def set_in(body: dict[str, Any], path: tuple[Any, ...], patch: dict[str, Any]) -> dict[str, Any]:
    if not path:
        return merge(body, patch)
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        items = list(body or [])
        items += [{}] * (head + 1 - len(items))
        items[head] = set_in(items[head], rest, patch)
        return items  # type: ignore[return-value]
    out = dict(body)
    out[head] = set_in(body.get(head) or {}, rest, patch)
    return out


def test_every_model_rule_has_a_violation_case() -> None:
    classes = {cls for _, cls in RULE_LOCATIONS}
    assert {c.__name__ for c in classes} == set(VIOLATIONS)
    for cls in classes:
        assert len(VIOLATIONS[cls.__name__]) == len(cls.RULES), cls.__name__
    assert {fmt(p) for p, _ in RULE_LOCATIONS} >= {
        "spec",
        "spec.model",
        "spec.model.cache",
        "spec.prefill",
        "spec.decode",
        "spec.prefill.rollout",
        "spec.decode.rollout",
        "spec.router",
        "spec.router.conversation",
        "spec.router.store",
        "spec.router.store.redis",
    }


@pytest.mark.parametrize("path,cls", RULE_LOCATIONS, ids=[f"{fmt(p)}:{c.__name__}" for p, c in RULE_LOCATIONS])
def test_rules_declared_in_the_crd_where_the_model_sits(path: tuple[Any, ...], cls: type[Checked]) -> None:
    node = schema_at(path)
    assert node["x-kubernetes-validations"] == [r.schema() for r in cls.RULES]
    for rule in cls.RULES:
        if rule.field_path:
            # the API server refuses a fieldPath that names no field of the schema
            assert rule.field_path.startswith(".") and rule.field_path[1:] in node["properties"]


@pytest.mark.parametrize("path,cls", RULE_LOCATIONS, ids=[f"{fmt(p)}:{c.__name__}" for p, c in RULE_LOCATIONS])
def test_python_reports_each_rule_with_the_crd_message_at_the_crd_location(
    path: tuple[Any, ...], cls: type[Checked]
) -> None:
    declared = schema_at(path)["x-kubernetes-validations"]
    for rule, patch, schema_rule in zip(cls.RULES, VIOLATIONS[cls.__name__], declared, strict=True):
        body = set_in(spec_dict(), path, patch)
        with pytest.raises(InvalidSpec) as info:
            parse_spec(body)
        where = fmt(path) + (schema_rule.get("fieldPath") or "")
        assert info.value.errors == [f"{where}: {schema_rule['message']}"], rule.message


def test_only_model_rules_and_the_name_rule_are_declared() -> None:
    declared = sum(len(n.get("x-kubernetes-validations", [])) for _, n in nodes(SPEC))
    assert declared == sum(len(cls.RULES) for _, cls in RULE_LOCATIONS)
    assert ROOT["x-kubernetes-validations"] == [NAME_RULE.schema()]
    assert "metadata.name" in NAME_RULE.cel and "55" in NAME_RULE.cel


_SELF_PATH = re.compile(r"self((?:\.[A-Za-z_]\w*)+)(\()?")


@pytest.mark.parametrize("path,cls", RULE_LOCATIONS, ids=[f"{fmt(p)}:{c.__name__}" for p, c in RULE_LOCATIONS])
def test_cel_names_only_fields_of_the_schema(path: tuple[Any, ...], cls: type[Checked]) -> None:
    node = schema_at(path)
    for rule in cls.RULES:
        for chain, call in _SELF_PATH.findall(rule.cel):
            segments = chain.strip(".").split(".")
            if call:
                segments = segments[:-1]  # a method: exists(), size(), startsWith()...
            sub = node
            for seg in segments:
                assert seg in sub.get("properties", {}), f"{rule.cel}: {seg} is not a field at {fmt(path)}"
                sub = sub["properties"][seg]


# --- agreement with the models ----------------------------------------------------------------------------------


def test_required_fields_match_the_models() -> None:
    for path, cls in model_paths():
        node = schema_at(path)
        required = {f.alias or n for n, f in cls.model_fields.items() if f.is_required()}
        assert set(node.get("required", [])) == required, fmt(path)
    assert SPEC["required"] == ["model"] and schema_at(("model",))["required"] == ["name"]


def test_defaults_match_the_models() -> None:
    checked = 0
    for path, alias, field in _class_fields():
        prop = schema_at(path)["properties"][alias]
        where = fmt(path + (alias,))
        if "default" in prop:
            # a default must itself be valid where it is applied (the API server checks this on CRD create)
            assert not list(jsonschema.Draft4Validator(prop).iter_errors(prop["default"])), where
        if field.is_required():
            assert "default" not in prop, where
            continue
        value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            # the API server fills an omitted object with this default: it must mean the model's default
            assert type(value).model_validate(prop["default"]) == value, where
        elif value is None or value == [] or value == {}:
            assert "default" not in prop, where
        else:
            assert prop["default"] == value, where
        checked += 1
    assert checked > 80
    assert schema_at(("kvTransfer", "decodeBlocksTTL"))["default"] == 480
    assert schema_at(("kvTransfer", "recomputeThreshold"))["default"] == 64
    assert schema_at(("kvTransfer", "bidirectional"))["default"] is True


def test_literal_fields_are_enums() -> None:
    checked = 0
    for path, alias, field in _class_fields():
        args = _literal_values(field.annotation)
        if args:
            assert schema_at(path)["properties"][alias]["enum"] == list(args), fmt(path + (alias,))
            checked += 1
    assert checked >= 10


def _literal_values(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    for arg in typing.get_args(annotation):
        found = _literal_values(arg)
        if found:
            return found
    return ()


# The CRD's OpenAPI constraints (bounds, patterns, lengths, enums) read as JSON Schema draft 4.
_VALIDATOR = jsonschema.Draft4Validator(SPEC)


def crd_accepts(body: dict[str, Any]) -> bool:
    return not list(_VALIDATOR.iter_errors(body))


def _at(path: str, value: Any) -> dict[str, Any]:
    out: Any = value
    for key in reversed(path.split(".")):
        out = {key: out}
    return out


@pytest.mark.parametrize("path,low,lowest,highest,high,extra", BOUNDS, ids=[b[0] for b in BOUNDS])
def test_crd_bounds_equal_python_bounds(
    path: str, low: Any, lowest: Any, highest: Any, high: Any, extra: dict[str, Any]
) -> None:
    for ok in (lowest, highest):
        body = spec_dict(merge(extra, _at(path, ok)))
        parse_spec(body)
        assert crd_accepts(body), (path, ok)
    for bad in (low, high):
        body = spec_dict(merge(extra, _at(path, bad)))
        with pytest.raises(InvalidSpec):
            parse_spec(body)
        assert not crd_accepts(body), (path, bad)


@pytest.mark.parametrize("path,bad,good", ENUMS, ids=[e[0] for e in ENUMS])
def test_crd_enums_equal_python_enums(path: str, bad: Any, good: list[Any]) -> None:
    assert not crd_accepts(spec_dict(_at(path, bad)))
    assert all(crd_accepts(spec_dict(_at(path, v))) for v in good)


@pytest.mark.parametrize("path", QUANTITIES)
def test_crd_quantity_pattern_equals_python(path: str) -> None:
    for value in ("1", "500m", "0.5", "1Gi", "1GB", "-1", "lots", "", "1 Gi"):
        body = spec_dict(_at(path, value))
        try:
            parse_spec(body)
            python_ok = True
        except InvalidSpec:
            python_ok = False
        assert crd_accepts(body) == python_ok, (path, value)


@pytest.mark.parametrize("full", [FULL, FULL_ALT], ids=["full", "full-alt"])
def test_crd_accepts_the_full_examples(full: dict[str, Any]) -> None:
    assert crd_accepts(full), [e.message for e in _VALIDATOR.iter_errors(full)]


def test_crd_enforces_lengths_and_patterns_like_python() -> None:
    cases = [
        {"model": {"name": ""}},
        {"model": {"name": "m", "extraArgs": ["--x"] * 65}},
        {"model": {"name": "m", "extraArgs": ["x" * 1025]}},
        {"model": {"name": "m", "env": [{"name": "1abc"}]}},
        {"model": {"name": "m", "cache": {"hostPath": {"path": "relative"}}}},
        {"model": {"name": "m"}, "router": {"store": {"redis": {"url": "http://x"}}}},
        {"model": {"name": "m"}, "prefill": {"nodeSelector": {"k": "v" * 64}}},
        {"model": {"name": "m"}, "prefill": {"tolerations": [{}] * 33}},
    ]
    for body in cases:
        with pytest.raises(InvalidSpec):
            parse_spec(body)
        assert not crd_accepts(body), body


# --- crds/ is generated, not edited -----------------------------------------------------------------------------


def test_committed_crd_is_up_to_date(tmp_path: Path) -> None:
    assert crds_main(["-o", str(tmp_path)]) == 0
    generated = (tmp_path / CRD_FILE).read_text()
    assert COMMITTED.name == CRD_FILE
    assert COMMITTED.read_text() == generated, "crds/ is stale: run `duplex crds -o crds` and commit the result"
    assert yaml.safe_load(generated) == crd()


def test_duplex_crds_command_prints_the_committed_file() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "duplex.cli", "crds"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == COMMITTED.read_text()
    assert out.stdout.startswith("# Generated by `duplex crds`")
