"""spec -> desired children: the one code path shared by `duplex render`, the operator and the tests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from duplex import revision
from duplex.api.meta import API_VERSION, KIND
from duplex.api.naming import NAME_RULE
from duplex.api.rules import RuleViolation
from duplex.api.spec import DisaggregatedServingSpec
from duplex.children.engine import ROLES, engine_workload
from duplex.children.engine_guard import engine_guard_configmap
from duplex.children.engine_key import engine_key_secret
from duplex.children.inference_pool import inference_pool
from duplex.children.network_policy import network_policies
from duplex.children.router import fabric_configmap, router_configmap, router_deployment, router_rbac
from duplex.children.services import drain_service, engine_service, router_service


class InvalidSpec(ValueError):
    """The spec breaks a schema or cross-field rule; the message matches what admission reports."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class Serving:
    name: str
    namespace: str
    spec: DisaggregatedServingSpec
    generation: int | None = None


def _loc(parts: tuple[Any, ...]) -> str:
    out = "spec"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _messages(err: ValidationError) -> list[str]:
    out = []
    for e in err.errors():
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, RuleViolation):
            path = _loc(e["loc"]) + (cause.rule.field_path or "")
            out.append(f"{path}: {cause.rule.message}")
        elif e["type"] == "extra_forbidden":
            out.append(f'{_loc(e["loc"])}: unknown field "{e["loc"][-1]}"')
        else:
            out.append(f"{_loc(e['loc'])}: {e['msg']}")
    return out


def _drop_nulls(value: Any) -> Any:
    """The API server prunes null fields (none is nullable) before defaulting; mirror it."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def parse_spec(spec: Any) -> DisaggregatedServingSpec:
    """Validate like admission: camelCase names only, no type coercion ("2" is not 2), nulls pruned."""
    try:
        return DisaggregatedServingSpec.model_validate(
            _drop_nulls(spec if spec is not None else {}), strict=True, by_alias=True, by_name=False
        )
    except ValidationError as err:
        raise InvalidSpec(_messages(err)) from None


def parse(doc: dict[str, Any], default_namespace: str = "default") -> Serving:
    """A DisaggregatedServing document -> Serving, or InvalidSpec."""
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise InvalidSpec(
            [f"expected apiVersion {API_VERSION} kind {KIND}, got {doc.get('apiVersion')} {doc.get('kind')}"]
        )
    meta = doc.get("metadata") or {}
    name = meta.get("name") or ""
    errors = [] if NAME_RULE.holds(name) else [NAME_RULE.message]
    try:
        spec = parse_spec(doc.get("spec"))
    except InvalidSpec as e:
        raise InvalidSpec(errors + e.errors) from None
    if errors:
        raise InvalidSpec(errors)
    return Serving(
        name=name, namespace=meta.get("namespace") or default_namespace, spec=spec, generation=meta.get("generation")
    )


def desired_children(
    serving: Serving,
    key_uid: str | None = None,
    auto_threshold: int | None = None,
    planned: Mapping[str, int] | None = None,
    legacy: bool = False,
) -> list[dict[str, Any]]:
    """Every object the operator applies for this serving, in apply order (RBAC and config before workloads).
    Not the engine key Secret: the operator creates that once, with a random key (key_secret); `key_uid`, the uid of
    the Secret as it exists, is stamped on the workloads' pod templates (a `duplex render` preview has none).
    `auto_threshold`: with recomputeThreshold: Auto, the router's threshold as measured (a preview has the initial).
    `planned`: the replicas the planner set for roles in scaling.mode Automatic (a preview has their start).
    The engine pods are stamped with their KV revision, unless `legacy` (duplex.revision)."""
    spec, name, ns = serving.spec, serving.name, serving.namespace
    objs: list[dict[str, Any]] = [
        *router_rbac(name, ns),
        router_configmap(spec, name, ns, auto_threshold),
        fabric_configmap(name, ns),
        engine_guard_configmap(name, ns),
    ]
    for role in ROLES:
        objs.append(engine_service(spec, name, ns, role))
    objs.append(router_service(spec, name, ns))
    objs.append(drain_service(name, ns))
    objs += network_policies(spec, name, ns)
    for role in ROLES:
        objs.append(engine_workload(spec, name, ns, role, key_uid, (planned or {}).get(role)))
    objs.append(router_deployment(spec, name, ns, key_uid))
    objs += inference_pool(spec, name, ns)  # last: its CRD may be missing, and the workloads must not wait for it
    return revision.stamp(objs, legacy)


def key_secret(serving: Serving) -> dict[str, Any]:
    """The engine key Secret without its key: created by the operator if missing, never applied or changed."""
    return engine_key_secret(serving.name, serving.namespace)
