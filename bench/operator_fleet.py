"""What the operator benchmark puts on the cluster: a fleet of fake kwok nodes big enough for every serving's pods,
and the servings themselves (pure: manifests in, manifests out).

The servings are the seed example cut to one GPU per engine (an 8B-class model at TP 1, 2 of a p5en's 16 EFA
devices), so eight engines share a fake p5en.48xlarge and 200 servings need 50 such nodes, not 400: the operator's
work per serving (15 children, one status) does not depend on the engine's size."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_NODES = ROOT / "tests/fixtures/fake-nodes.yaml"
SEED = ROOT / "examples/seed.yaml"

ENGINES_PER_GPU_NODE = 8  # TP 1: one of a p5en's 8 GPUs each
ROUTERS_PER_CPU_NODE = 50  # 250m each on an m7i.4xlarge's 15.9 allocatable cores, under its 110-pod limit


def serving(name: str, namespace: str) -> dict[str, Any]:
    doc = copy.deepcopy(yaml.safe_load(SEED.read_text()))
    doc["metadata"] = {"name": name, "namespace": namespace}
    spec = doc["spec"]
    spec["model"]["name"] = "Qwen/Qwen3-8B"
    for role in ("prefill", "decode"):
        spec[role].update({"tensorParallelSize": 1, "cpu": "16", "memory": "200Gi"})
    spec["network"]["efa"].update({"devicesPerPod": 2, "hugepages2Mi": "1Gi", "shmSize": "8Gi"})
    spec["router"].update({"cpu": "250m", "memory": "512Mi"})
    return doc


def node_counts(servings: int) -> tuple[int, int]:
    """(GPU nodes, CPU nodes) that hold `servings` servings' pods: one prefill, one decode and one router each."""
    return math.ceil(2 * servings / ENGINES_PER_GPU_NODE), max(1, math.ceil(servings / ROUTERS_PER_CPU_NODE))


def _templates() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(FIXTURE_NODES.read_text()) if d]
    kind = "node.kubernetes.io/instance-type"
    gpu = next(d for d in docs if d["metadata"]["labels"][kind] == "p5en.48xlarge")
    cpu = next(d for d in docs if d["metadata"]["labels"][kind] == "m7i.4xlarge")
    return gpu, cpu


def _clone(template: dict[str, Any], name: str, subnet: int, index: int) -> dict[str, Any]:
    node = copy.deepcopy(template)
    node["metadata"]["name"] = name
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    cidr = f"10.{subnet}.{index}.0/24"
    node["spec"]["podCIDR"], node["spec"]["podCIDRs"] = cidr, [cidr]
    zone = node["metadata"]["labels"]["topology.kubernetes.io/zone"]
    node["spec"]["providerID"] = f"aws:///{zone}/i-0b{subnet:02x}{index:014x}"
    node["status"]["addresses"] = [
        {"type": "InternalIP", "address": f"10.{subnet - 100}.{index}.10"},
        {"type": "Hostname", "address": name},
    ]
    return node


def fleet(servings: int) -> list[dict[str, Any]]:
    """Fake nodes cloned from the fixture's p5en.48xlarge and m7i.4xlarge, each with its own podCIDR and address."""
    gpu_nodes, cpu_nodes = node_counts(servings)
    gpu, cpu = _templates()
    return [_clone(gpu, f"p5en-{i}", 200, i) for i in range(gpu_nodes)] + [
        _clone(cpu, f"cpu-{i}", 201, i) for i in range(cpu_nodes)
    ]


def write_fleet(servings: int, path: Path) -> Path:
    path.write_text(yaml.safe_dump_all(fleet(servings), sort_keys=False))
    return path
