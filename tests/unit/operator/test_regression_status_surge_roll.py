"""Regression (fixed): during a surge roll status says Ready=True / Progressing=False while the new engine pod is still loading.

operator/duplex/status.py role_status()/_role_condition() and the `rolling` list in compute() look only at
readyReplicas and updatedReplicas. With maxSurge 1 (the default) and replicas 1, right after a template change the
Deployment reports: replicas 2 (old + new pod), updatedReplicas 1 (the new pod, still loading for up to 30 min),
readyReplicas 1 / availableReplicas 1 (the OLD pod). Then ready >= desired and updated >= desired, so
PrefillReady=True, Ready=True and Progressing=False ("all workloads on the current spec"), although no pod runs the
new spec. (kubectl rollout status would say "1 old replicas are pending termination".)
Fix: treat a role as rolled out only when status.replicas == status.updatedReplicas (no old pods left) and
availableReplicas (or readyReplicas) >= desired, with observedGeneration current; i.e. in role_status also read
status.replicas and in _role_condition / `rolling` require `total == updated` in addition to the current checks.
"""

from dsv_helpers import serving

from duplex import status


def dep(replicas, ready, updated, total, generation=2):
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": generation,
            "replicas": total,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "availableReplicas": ready,
            "unavailableReplicas": total - ready,
        },
    }


def test_surge_roll_with_new_pod_not_ready_is_progressing_and_not_ready():
    s = serving()
    ok = dep(1, 1, 1, 1)
    rolling = dep(1, ready=1, updated=1, total=2)  # old pod ready, new pod created but loading
    st = status.patch_body(status.compute(s, {"prefill": rolling, "decode": ok, "router": ok}, None))
    c = {x["type"]: x for x in st["conditions"]}
    assert c["Progressing"]["status"] == "True"
    assert c["PrefillReady"]["status"] == "False"
    assert c["Ready"]["status"] == "False"
