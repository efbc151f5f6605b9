"""Shared helpers of the operator unit tier: example documents, spec patches, rendering and object lookup."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from duplex.api.meta import API_VERSION, KIND
from duplex.render import Serving, desired_children, parse, parse_spec

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
SEED = EXAMPLES / "seed.yaml"
TRAINIUM = EXAMPLES / "trainium.yaml"
CRD_FILE = REPO / "crds" / "duplex.dev_disaggregatedservings.yaml"

MINIMAL: dict[str, Any] = {"model": {"name": "org/model"}}


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def merge(base: Any, patch: Any) -> Any:
    """Deep merge for dicts (patch wins); any other value replaces. Never mutates its inputs."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for k, v in patch.items():
            out[k] = merge(base.get(k), v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(patch)


def spec_dict(patch: dict[str, Any] | None = None, base: dict[str, Any] | None = None) -> dict[str, Any]:
    return merge(MINIMAL if base is None else base, patch or {})


def spec(patch: dict[str, Any] | None = None, base: dict[str, Any] | None = None):
    return parse_spec(spec_dict(patch, base))


def doc(spec_body: dict[str, Any], name: str = "demo", namespace: str | None = None, **meta: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, **meta}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec_body}


def serving(
    patch: dict[str, Any] | None = None, base: dict[str, Any] | None = None, name: str = "demo", namespace: str = "ns1"
) -> Serving:
    return parse(doc(spec_dict(patch, base), name=name, namespace=namespace))


def children(
    patch: dict[str, Any] | None = None, base: dict[str, Any] | None = None, name: str = "demo", namespace: str = "ns1"
) -> list[dict[str, Any]]:
    return desired_children(serving(patch, base, name, namespace))


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind} {name}, got {len(hits)}"
    return hits[0]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_map(ctr: dict[str, Any]) -> dict[str, dict[str, Any]]:
    names = [e["name"] for e in ctr["env"]]
    assert len(names) == len(set(names)), f"duplicate env vars: {names}"
    return {e["name"]: e for e in ctr["env"]}


def arg_value(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} appears {args.count(flag)} times in {args}"
    return args[args.index(flag) + 1]


def may_name_an_owned_flag(arg: str) -> bool:
    """Whether vLLM's parser could read arg as a flag duplex owns, or one prefill and decode must share: exactly, as
    `flag=`, with underscores, with a dotted sub-key, or as an argparse abbreviation. Generated "free" extraArgs
    stay clear of all of these."""
    from duplex.api.owned_args import OWNED_FLAGS, uses_flag
    from duplex.api.pairing import PAIRED_FLAGS

    owned = [f for flags, _ in (*OWNED_FLAGS, *PAIRED_FLAGS) for f in flags]
    if any(uses_flag([arg], f) for f in owned):
        return True
    head = arg.split("=", 1)[0]
    if head.startswith("--"):
        key = head[2:].split(".", 1)[0].replace("_", "-")
        return any(f.startswith("--" + key) for f in owned)
    if head.startswith("-") and len(head) > 1:
        return any(f.startswith(head) for f in owned if not f.startswith("--"))
    return False
