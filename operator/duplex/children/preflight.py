"""The preflight init containers of an engine pod (`duplex preflight`, sidecars/duplex_sidecars/preflight).

The checks must see what vLLM will see, so the preflight runs in the engine image, with the engine container's EFA
devices, hugepages, securityContext and env. The engine image has no duplex, so a first init container of the
duplex image copies the preflight package (standard library only, until it loads the engine image's NIXL) into a
shared emptyDir. The compact report goes to the termination message, which status.py turns into FabricReady.
"""

from __future__ import annotations

import copy
from typing import Any

from duplex.api.spec import DisaggregatedServingSpec, RoleSpec
from duplex.children import efa
from duplex.children.kv_config import backend

CONTAINER = "preflight"
VOLUME = "duplex-preflight"
MOUNT = "/opt/duplex-preflight"
# Run by the duplex image's python: copy the package (and its parent's __init__) where the engine image finds it.
_COPY = (
    "import pathlib, shutil, duplex_sidecars.preflight as p; "
    "src = pathlib.Path(p.__file__).parent; "
    f"dst = pathlib.Path('{MOUNT}') / 'duplex_sidecars'; "
    "dst.mkdir(parents=True, exist_ok=True); "
    "shutil.copy(src.parent / '__init__.py', dst); "
    "shutil.copytree(src, dst / 'preflight', dirs_exist_ok=True, ignore=shutil.ignore_patterns('__pycache__'))"
)


def enabled(spec: DisaggregatedServingSpec) -> bool:
    on = spec.network.preflight.enabled
    return spec.network.efa.enabled if on is None else on


def preflight_args(spec: DisaggregatedServingSpec) -> list[str]:
    """What the spec promises the pod: the backend, and with EFA the devices and hugepages it requests."""
    args = ["--backend", backend(spec)]
    e = spec.network.efa
    if e.enabled:
        args += ["--efa-devices", str(e.devices_per_pod), "--hugepages", e.hugepages2_mi]
    if spec.network.preflight.strict:
        args.append("--strict")
    return args


def init_containers(
    spec: DisaggregatedServingSpec, role: RoleSpec, env: list[dict[str, Any]], security: dict[str, Any]
) -> list[dict[str, Any]]:
    """[copy the package, run it], or [] when preflight is off. `env`, `security`: the engine container's."""
    if not enabled(spec):
        return []
    mount = {"name": VOLUME, "mountPath": MOUNT}
    install = {
        "name": "preflight-install",
        "image": spec.network.preflight.image,
        "command": ["python3", "-c", _COPY],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [mount],
    }
    # The engine's resources without the accelerator: the kubelet hands an init container's EFA devices on to the
    # engine container, and the pod's request is the larger of the two, so nothing is requested twice.
    resources = efa.resources(spec, role)
    for side in resources.values():
        side.pop(role.accelerator.type, None)
    check = {
        "name": CONTAINER,
        "image": spec.model.image,
        "imagePullPolicy": spec.model.image_pull_policy,
        "command": ["python3", "-m", "duplex_sidecars.preflight", *preflight_args(spec)],
        # its own PYTHONPATH in place of the engine's (the engine guard's): a name twice is refused by server-side apply
        "env": [*(copy.deepcopy(e) for e in env if e["name"] != "PYTHONPATH"), {"name": "PYTHONPATH", "value": MOUNT}],
        "resources": resources,
        "securityContext": copy.deepcopy(security),
        "terminationMessagePolicy": "File",  # the compact JSON report, read back by the operator
        "volumeMounts": [mount],
    }
    return [install, check]


def volumes(spec: DisaggregatedServingSpec) -> list[dict[str, Any]]:
    return [{"name": VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}] if enabled(spec) else []
