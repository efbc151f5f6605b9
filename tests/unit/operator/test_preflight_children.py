"""The preflight init containers (rendered with EFA, or when asked) and FabricReady from the pods' reports."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dsv_helpers import children, find, spec

from duplex import IMAGE
from duplex.fabric import fabric_ready

EFA = {"network": {"efa": {"enabled": True}}, "prefill": {"memory": "1Gi"}, "decode": {"memory": "1Gi"}}


def pod_spec(patch: dict[str, Any] | None = None, role: str = "prefill") -> dict[str, Any]:
    return find(children(patch), "Deployment", f"demo-{role}")["spec"]["template"]["spec"]


def engine_env(ctr: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in ctr["env"]}


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_with_efa_the_preflight_runs_in_the_engine_image_with_the_engines_devices(role: str) -> None:
    ps = pod_spec(EFA, role)
    install, check = ps["initContainers"]
    (engine,) = ps["containers"]
    assert install["image"] == IMAGE  # the duplex image, which holds the package
    assert install["securityContext"]["runAsNonRoot"] and install["securityContext"]["readOnlyRootFilesystem"]
    assert check["image"] == engine["image"]  # the checks see the engine image's libfabric and NIXL
    assert check["command"] == ["python3", "-m", "duplex_sidecars.preflight", "--backend", "LIBFABRIC",
                                "--efa-devices", "16", "--hugepages", "5120Mi"]  # fmt: skip
    assert check["securityContext"] == engine["securityContext"]  # IPC_LOCK as the engine has it
    # the engine's env, with the package's PYTHONPATH in place of the engine guard's; the revision is the engine's own
    assert check["env"][:-1] == [e for e in engine["env"] if e["name"] not in ("PYTHONPATH", "DUPLEX_KV_REVISION")]
    assert (
        check["env"][-1] == {"name": "PYTHONPATH", "value": "/opt/duplex-preflight"} != engine_env(engine)["PYTHONPATH"]
    )
    limits = check["resources"]["limits"]
    assert limits["vpc.amazonaws.com/efa"] == "16" and limits["hugepages-2Mi"] == "5120Mi"
    assert "nvidia.com/gpu" not in limits and engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert check["terminationMessagePolicy"] == "File"
    mounts = {m["mountPath"] for m in install["volumeMounts"]} & {m["mountPath"] for m in check["volumeMounts"]}
    assert mounts == {"/opt/duplex-preflight"}
    assert {"name": "duplex-preflight", "emptyDir": {"sizeLimit": "16Mi"}} in ps["volumes"]


def test_off_without_efa_unless_asked_and_strict_passes_through() -> None:
    assert "initContainers" not in pod_spec()
    (_, check) = pod_spec({"network": {"preflight": {"enabled": True, "strict": True}}})["initContainers"]
    assert check["command"][3:] == ["--backend", "UCX", "--strict"]
    assert "initContainers" not in pod_spec({**EFA, "network": {**EFA["network"], "preflight": {"enabled": False}}})


def test_the_router_image_does_not_roll_engines_the_preflight_image_does() -> None:
    base = pod_spec(EFA)
    assert pod_spec({**EFA, "router": {"image": "r:2"}}) == base
    moved = pod_spec({**EFA, "network": {**EFA["network"], "preflight": {"image": "d:2"}}})
    assert moved["initContainers"][0]["image"] == "d:2"


# --- FabricReady --------------------------------------------------------------------------------------------------


def pod(name: str, message: str | None, role: str = "prefill", last: bool = False) -> dict[str, Any]:
    statuses = []
    if message is not None:
        state = {"terminated": {"exitCode": 0, "message": message}}
        statuses = [
            {"name": "preflight", **({"lastState": state, "state": {"waiting": {}}} if last else {"state": state})}
        ]
    labels = {"duplex.dev/serving": "demo", "duplex.dev/role": role}
    return {"kind": "Pod", "metadata": {"name": name, "labels": labels}, "status": {"initContainerStatuses": statuses}}


def report(ok: bool, *checks: dict[str, Any], backend: str = "LIBFABRIC") -> str:
    return json.dumps({"version": 1, "ok": ok, "backend": backend, "checks": list(checks)})


PASS = report(True, {"name": "efa_devices", "status": "pass", "value": "16 of 16"})
FAIL = report(False, {"name": "efa_devices", "status": "pass", "value": "16 of 16"},
              {"name": "libfabric_efa", "status": "fail", "value": "no efa", "message": "use the EFA installer's libfabric"},
              {"name": "loopback", "status": "skip", "value": "not run"})  # fmt: skip


def test_fabric_ready_reads_the_preflight_reports() -> None:
    s = spec(EFA)
    assert fabric_ready(s, "demo", []) == ("Unknown", "Pending", "no engine pod has finished its preflight yet")
    assert fabric_ready(s, "demo", [pod("p-1", None)])[1] == "Pending"
    ok = fabric_ready(s, "demo", [pod("p-1", PASS), pod("d-1", PASS, "decode")])
    assert ok == ("True", "PreflightPassed", "2/2 engine pods passed preflight (LIBFABRIC)")
    bad = fabric_ready(s, "demo", [pod("p-1", PASS), pod("d-1", FAIL, "decode", last=True)])
    assert bad == ("False", "LibfabricEfa", "pod d-1: libfabric_efa: use the EFA installer's libfabric")


def test_fabric_ready_ignores_other_servings_routers_and_leaving_pods() -> None:
    s = spec(EFA)
    other = pod("x", FAIL)
    other["metadata"]["labels"]["duplex.dev/serving"] = "other"
    router = pod("r", FAIL, role="router")
    leaving = pod("old", FAIL)
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert fabric_ready(s, "demo", [other, router, leaving, pod("p", PASS)])[0] == "True"


def test_an_unreadable_report_and_a_strict_warning() -> None:
    s = spec(EFA)
    assert fabric_ready(s, "demo", [pod("p", "Error: OOMKilled")])[:2] == ("False", "PreflightUnreadable")
    strict = report(False, {"name": "fabric_env", "status": "warn", "value": "x", "message": "put efa first"})
    assert fabric_ready(s, "demo", [pod("p", strict)]) == ("False", "FabricEnv", "pod p: fabric_env: put efa first")


def test_without_preflight_fabric_ready_is_unknown() -> None:
    assert fabric_ready(spec(), "demo", [pod("p", FAIL)])[:2] == ("Unknown", "NotChecked")
