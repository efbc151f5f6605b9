"""Every rendered object (examples, variants, random valid specs) and the CRD itself pass the Kubernetes OpenAPI
schemas in strict mode (no unknown fields), via the kubernetes-validate package."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
from dsv_cases import FULL, FULL_ALT
from dsv_helpers import SEED, TRAINIUM, children, doc, load, may_name_an_owned_flag, merge
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes_validate import utils as kv_utils

from duplex.children.kinds import INFERENCE_POOL, LEADER_WORKER_SET, kind_of
from duplex.crd import crd
from duplex.render import desired_children, parse, parse_spec

TARGET = "1.36"
VERSIONS = sorted(
    {kv_utils.major_minor(v) for v in kv_utils.all_versions()}, key=lambda v: tuple(int(x) for x in v.split("."))
)
K8S = TARGET if TARGET in VERSIONS else VERSIONS[-1]
NEWEST = VERSIONS[-1]


@pytest.fixture(scope="module", autouse=True)
def cached_schemas() -> Iterator[None]:
    # kubernetes-validate reads its JSON schema files on every call; cache them for the module (same files, same
    # validator) so hundreds of objects validate in seconds.
    original = kv_utils.schema_contents
    kv_utils.schema_contents = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        kv_utils.schema_contents = original


def validate(obj: dict[str, Any], version: str = K8S) -> None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {where}: {e.message}")


_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_PORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def apiserver_checks(objs: list[dict[str, Any]]) -> None:
    """A few API server validations the OpenAPI schemas cannot express (names, label values, port names)."""
    for obj in objs:
        meta = obj["metadata"]
        name_re = _DNS1035 if obj["kind"] == "Service" else _DNS1123
        assert len(meta["name"]) <= (63 if obj["kind"] == "Service" else 253) and name_re.match(meta["name"])
        for value in meta.get("labels", {}).values():
            assert len(value) <= 63 and _LABEL_VALUE.match(value), value
        if obj["kind"] == "Deployment":
            tpl = obj["spec"]["template"]
            assert obj["spec"]["selector"]["matchLabels"].items() <= tpl["metadata"]["labels"].items()
            for value in tpl["metadata"]["labels"].values():
                assert len(value) <= 63 and _LABEL_VALUE.match(value), value
            for ctr in [*tpl["spec"]["containers"], *tpl["spec"].get("initContainers", [])]:
                # env and volumeMounts are list-maps keyed by name: server-side apply refuses a duplicate key
                env_names = [e["name"] for e in ctr.get("env", [])]
                assert len(env_names) == len(set(env_names)), f"{ctr['name']}: duplicate env {env_names}"
                mount_names = [m["name"] for m in ctr.get("volumeMounts", [])]
                assert len(mount_names) == len(set(mount_names)), f"{ctr['name']}: duplicate mounts {mount_names}"
            for ctr in tpl["spec"]["containers"]:
                port_names = [p["name"] for p in ctr.get("ports", [])]
                assert len(port_names) == len(set(port_names))
                assert all(len(n) <= 15 and _PORT_NAME.match(n) for n in port_names)
                volume_names = {v["name"] for v in tpl["spec"]["volumes"]}
                assert {m["name"] for m in ctr.get("volumeMounts", [])} <= volume_names


def validate_all(objs: list[dict[str, Any]], version: str = K8S) -> None:
    assert objs
    for obj in objs:
        if kind_of(obj) is LEADER_WORKER_SET:  # no Kubernetes schema for the set: its pod templates have one
            for rank in ("leaderTemplate", "workerTemplate"):
                template = obj["spec"]["leaderWorkerTemplate"][rank]
                validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": obj["metadata"], "template": template})
        elif kind_of(obj) is not INFERENCE_POOL:  # no Kubernetes schema: tests/integration/test_inference_pool_crd.py
            validate(obj, version)
    apiserver_checks(objs)


# --- the validator really validates -----------------------------------------------------------------------------


def test_versions() -> None:
    assert K8S == TARGET, f"kubernetes-validate ships {VERSIONS}; expected {TARGET}"


@pytest.mark.parametrize("breakage", ["unknown container field", "wrong type", "missing required", "wrong nested type"])
def test_strict_validation_catches_broken_objects(breakage: str) -> None:
    objs = children()
    deployment = next(o for o in objs if o["kind"] == "Deployment")
    ctr = deployment["spec"]["template"]["spec"]["containers"][0]
    if breakage == "unknown container field":
        ctr["imagePullPolicyy"] = "Always"
    elif breakage == "wrong type":
        deployment["spec"]["replicas"] = "one"
    elif breakage == "missing required":
        del ctr["name"]
    else:
        ctr["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S, strict=True)


# --- examples and variants --------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", [SEED, TRAINIUM], ids=["seed", "trainium"])
@pytest.mark.parametrize("version", sorted({K8S, NEWEST}))
def test_examples_validate(example: Any, version: str) -> None:
    validate_all(desired_children(parse(load(example))), version)


VARIANTS: dict[str, dict[str, Any]] = {
    "minimal": {},
    "cpu with preflight": {
        "prefill": {"accelerator": {"type": "cpu"}, "memory": "8Gi"},
        "decode": {"accelerator": {"type": "cpu"}, "memory": "8Gi"},
        "model": {"blockSize": 32},
        "network": {"preflight": {"enabled": True}},
    },
    "full pvc + redis url": FULL,
    "full hostPath + redis secret": FULL_ALT,
    "efa privileged": {
        "network": {"efa": {"enabled": True, "privileged": True}},
        "prefill": {"memory": "1Gi"},
        "decode": {"memory": "1Gi"},
    },
    "efa with user pod affinity": {
        "network": {"efa": {"enabled": True}},
        "prefill": {
            "memory": "1Gi",
            "affinity": {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": {"a": "b"}}, "topologyKey": "kubernetes.io/hostname"}
                    ]
                }
            },
        },
        "decode": {"memory": "1Gi"},
    },
    "neuron without efa": {
        "prefill": {"accelerator": {"type": "aws.amazon.com/neuron"}, "tensorParallelSize": 8},
        "decode": {"accelerator": {"type": "aws.amazon.com/neuron"}, "tensorParallelSize": 8},
    },
    "scaled to zero": {"prefill": {"replicas": 0}, "decode": {"replicas": 0}, "router": {"replicas": 0}},
    "load balancer": {
        "router": {
            "service": {
                "type": "LoadBalancer",
                "port": 443,
                "annotations": {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internet-facing"},
            }
        }
    },
    "node port": {"router": {"service": {"type": "NodePort"}}},
    "no prefix caching, all optional flags": {
        "model": {"maxModelLen": 4096, "servedModelName": "m"},
        "prefill": {"enablePrefixCaching": False, "maxNumSeqs": 1, "maxNumBatchedTokens": 2048},
    },
}


@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_variants_validate(variant: str) -> None:
    objs = desired_children(
        parse(doc(merge({"model": {"name": "org/model"}}, VARIANTS[variant]), name="v", namespace="team-a"))
    )
    parsed = parse_spec(merge({"model": {"name": "m"}}, VARIANTS[variant]))
    policies = 3 if parsed.network.network_policy.enabled else 0
    pools = 1 if parsed.router.inference_pool.enabled else 0
    assert len(objs) == 13 + policies + pools  # a NetworkPolicy per engine role and the router, unless turned off
    validate_all(objs)


def test_longest_name_renders_valid_objects() -> None:
    name = "a" * 55
    objs = desired_children(parse(doc({"model": {"name": "m"}}, name=name)))
    assert max(len(o["metadata"]["name"]) for o in objs) == 63
    validate_all(objs)


def test_crd_validates_as_a_custom_resource_definition() -> None:
    for version in sorted({K8S, NEWEST}):
        validate(crd(), version)


# --- random valid specs -----------------------------------------------------------------------------------------

_QUANTITY = st.sampled_from(["1", "2", "500m", "0.5", "96", "1Gi", "1024Mi", "64G", "1000Gi", "5120Mi", "2k"])
_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
_NODE_KEYS = st.sampled_from(
    ["node.kubernetes.io/instance-type", "pool", "topology.kubernetes.io/zone", "example.com/accelerator"]
)
_TOLERATION = st.sampled_from(
    [
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists"},
        {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
)
_AFFINITY = st.sampled_from(
    [
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100", "h200"]}]}
                    ]
                }
            }
        },
        {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 10,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": {"app": "x"}},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        },
        {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchExpressions": [{"key": "k", "operator": "Exists"}]}, "topologyKey": "zone"}
                ]
            }
        },
    ]
)
_SPREAD = st.sampled_from(
    [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"},
        {
            "maxSkew": 2,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"duplex.dev/role": "decode"}},
        },
    ]
)
_ENV_NAME = st.from_regex(r"[A-Z_][A-Z0-9_]{0,15}", fullmatch=True)
_ENV = st.one_of(
    st.builds(lambda n, v: {"name": n, "value": v}, _ENV_NAME, st.text(max_size=20)),
    st.builds(
        lambda n, src: {"name": n, "valueFrom": src},
        _ENV_NAME,
        st.sampled_from(
            [
                {"fieldRef": {"fieldPath": "spec.nodeName"}},
                {"secretKeyRef": {"name": "s", "key": "k", "optional": True}},
                {"configMapKeyRef": {"name": "c", "key": "k"}},
                {"resourceFieldRef": {"resource": "limits.memory"}},
            ]
        ),
    ),
)
_ARGS = st.lists(st.from_regex(r"--[a-z][a-z0-9-]{0,20}(=[a-z0-9.]{1,8})?", fullmatch=True), max_size=4).filter(
    lambda args: not any(may_name_an_owned_flag(a) for a in args)
)


def _opt(d: dict[str, Any], key: str, value: Any, present: bool) -> None:
    if present:
        d[key] = value


@st.composite
def role_specs(draw: st.DrawFn, tp: int, efa: bool) -> dict[str, Any]:
    role: dict[str, Any] = {"tensorParallelSize": tp}
    b = lambda: draw(st.booleans())  # noqa: E731
    _opt(role, "replicas", draw(st.integers(0, 1000)), b())
    _opt(
        role,
        "accelerator",
        draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "type": st.sampled_from(["nvidia.com/gpu", "aws.amazon.com/neuron"]),
                    "count": st.integers(1, 64),
                },
            )
        ),
        b(),
    )
    _opt(role, "cpu", draw(_QUANTITY), b())
    _opt(role, "memory", draw(_QUANTITY), efa or b())
    _opt(role, "gpuMemoryUtilization", draw(st.floats(0.01, 1.0)), b())
    _opt(role, "enablePrefixCaching", draw(st.booleans()), b())
    _opt(role, "maxNumSeqs", draw(st.integers(1, 65536)), b())
    _opt(role, "maxNumBatchedTokens", draw(st.integers(1, 16_777_216)), b())
    _opt(role, "nodeSelector", draw(st.dictionaries(_NODE_KEYS, _LABEL, max_size=2)), b())
    _opt(role, "tolerations", draw(st.lists(_TOLERATION, max_size=3)), b())
    _opt(role, "affinity", draw(_AFFINITY), b())
    _opt(role, "topologySpreadConstraints", draw(st.lists(_SPREAD, max_size=1)), b())
    _opt(role, "priorityClassName", draw(_LABEL), b())
    _opt(role, "rollout", {"maxSurge": draw(st.integers(1, 100)), "maxUnavailable": draw(st.integers(0, 100))}, b())
    _opt(role, "env", draw(st.lists(_ENV, max_size=3, unique_by=lambda e: e["name"])), b())
    _opt(role, "extraArgs", draw(_ARGS), b())
    return role


def _same_accelerator(role: dict[str, Any], like: dict[str, Any]) -> dict[str, Any]:
    """Decode on prefill's kind of accelerator (admission refuses anything else)."""
    kind = (like.get("accelerator") or {}).get("type", "nvidia.com/gpu")
    return {**role, "accelerator": {**(role.get("accelerator") or {}), "type": kind}}


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    efa = draw(st.booleans())
    prefill_tp = draw(st.integers(1, 64))
    decode_tp = draw(st.integers(prefill_tp, 64))
    blocks_ttl = draw(st.integers(60, 86400))
    router_replicas = draw(st.integers(0, 100))
    redis = draw(
        st.one_of(
            st.none(), st.just({"url": "redis://redis:6379/0"}), st.just({"urlSecret": {"name": "redis", "key": "url"}})
        )
    )
    if router_replicas > 1 and redis is None:
        redis = {"url": "rediss://redis:6380"}
    spec: dict[str, Any] = {
        "model": draw(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["Qwen/Qwen3-32B", "/models/llama", "m"])},
                optional={
                    "servedModelName": _LABEL,
                    "image": st.sampled_from(
                        ["vllm/vllm-openai:v0.33.0", "registry.example:5000/vllm@sha256:" + "a" * 64]
                    ),
                    "imagePullPolicy": st.sampled_from(["Always", "IfNotPresent", "Never"]),
                    "dtype": st.sampled_from(["auto", "bfloat16", "float16"]),
                    "maxModelLen": st.integers(1, 16_777_216),
                    "blockSize": st.sampled_from([1, 8, 16, 32, 64, 128]),
                    "hfTokenSecret": st.just({"name": "hf", "key": "token"}),
                    "cache": st.sampled_from(
                        [
                            {"pvc": {"claimName": "weights"}},
                            {"hostPath": {"path": "/mnt/nvme"}, "mountPath": "/data"},
                            {"pvc": {"claimName": "w", "readOnly": False}, "mountPath": "/m"},
                        ]
                    ),
                    "env": st.lists(_ENV, max_size=2, unique_by=lambda e: e["name"]),
                    "extraArgs": _ARGS,
                },
            )
        ),
        "prefill": (prefill := draw(role_specs(prefill_tp, efa))),
        "decode": _same_accelerator(draw(role_specs(decode_tp, efa)), prefill),
        "network": {
            "efa": draw(
                st.fixed_dictionaries(
                    {"enabled": st.just(efa)},
                    optional={
                        "devicesPerPod": st.integers(1, 64),
                        "hugepages2Mi": _QUANTITY,
                        "shmSize": _QUANTITY,
                        "privileged": st.booleans(),
                        "forkSafe": st.booleans(),
                        "sameZone": st.booleans(),
                        "libraryPath": st.just("/opt/efa/lib"),
                    },
                )
            )
        },
        "kvTransfer": draw(
            st.fixed_dictionaries(
                {"decodeBlocksTTL": st.just(blocks_ttl)},
                optional={
                    "backend": st.sampled_from(["UCX", "LIBFABRIC"]),
                    "bufferDevice": st.sampled_from(["cuda", "cpu"]),
                    "bidirectional": st.booleans(),
                    "recomputeThreshold": st.one_of(st.integers(0, 1_048_576), st.just("Auto")),
                    "leaseDuration": st.integers(6, 3600),
                    "loadFailurePolicy": st.sampled_from(["recompute", "fail"]),
                    "sideChannelPort": st.integers(1024, 65535).filter(lambda port: port != 8000),  # the HTTP port
                },
            )
        ),
        "router": {
            "replicas": router_replicas,
            "cpu": draw(_QUANTITY),
            "memory": draw(st.sampled_from(["256Mi", "1Gi", "3Gi", "1024Mi", "64G"])),
            "service": draw(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "type": st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]),
                        "port": st.integers(1, 65535),
                        "annotations": st.dictionaries(_NODE_KEYS, st.text(max_size=10), max_size=2),
                    },
                )
            ),
            "conversation": draw(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "ttl": st.integers(1, blocks_ttl - 1),
                        "tenantHeader": st.just("X-Tenant"),
                        "header": st.one_of(st.none(), st.just("X-Session")),
                    },
                )
            ),
            "store": {"type": "redis", "redis": redis} if redis else {"type": "memory"},
            "nodeSelector": draw(st.dictionaries(_NODE_KEYS, _LABEL, max_size=2)),
            "tolerations": draw(st.lists(_TOLERATION, max_size=2)),
        },
    }
    return spec


_NAMES = st.from_regex(r"[a-z]([-a-z0-9]{0,53}[a-z0-9])?", fullmatch=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=valid_specs(), name=_NAMES, namespace=st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True))
def test_random_valid_specs_render_objects_that_pass_the_kubernetes_schemas(
    spec: dict[str, Any], name: str, namespace: str
) -> None:
    objs = desired_children(parse(doc(spec, name=name, namespace=namespace)))
    assert [o["kind"] for o in objs].count("Deployment") == 3
    assert {o["metadata"]["namespace"] for o in objs} == {namespace}
    validate_all(objs)
