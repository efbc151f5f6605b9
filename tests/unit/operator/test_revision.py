"""KV revisions: a KV-compatible change keeps the engine pods' revision, an incompatible one makes a new one for both
roles; pods stamped with it carry the label, the environment variable and the readiness gate; the role Services name
it; engines from before revisions are left unstamped while changes keep their KV."""

from __future__ import annotations

from typing import Any

import pytest
import sync_helpers
from dsv_helpers import serving
from sync_helpers import parent

from duplex import revision
from duplex.render import desired_children
from duplex.sync import sync


def rendered(patch: dict[str, Any] | None = None, legacy: bool = False) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in desired_children(serving(patch), legacy=legacy)}


def rev(objs: dict[str, dict[str, Any]]) -> tuple[str | None, str | None]:
    return tuple(revision.of_template(objs[f"Deployment/demo-{r}"]["spec"]["template"]) for r in ("prefill", "decode"))  # type: ignore[return-value]


def test_both_roles_share_one_revision_that_a_compatible_change_keeps() -> None:
    base = rendered()
    p, d = rev(base)
    assert p == d and p is not None and len(p) == 8
    assert rev(rendered({"decode": {"cpu": "16", "memory": "64Gi"}})) == (p, d)
    assert rev(rendered({"prefill": {"maxNumSeqs": 8}})) == (p, d)


def test_an_incompatible_change_to_one_role_gives_both_a_new_revision() -> None:
    p, _ = rev(rendered())
    after = rendered({"model": {"blockSize": 32}})
    assert rev(after)[0] == rev(after)[1] != p
    # decode below prefill in TP changes what pairs are served: a new revision too
    below = {"prefill": {"tensorParallelSize": 2}, "kvTransfer": {"allowDecodeTPBelowPrefill": True}}
    assert rev(rendered(below))[0] != p


def test_stamped_pods_carry_label_env_gate_and_the_services_name_the_revision() -> None:
    objs = rendered()
    p, _ = rev(objs)
    for role in ("prefill", "decode"):
        template = objs[f"Deployment/demo-{role}"]["spec"]["template"]
        assert template["metadata"]["labels"]["duplex.dev/kv-revision"] == p
        (vllm,) = template["spec"]["containers"]
        assert {"name": "DUPLEX_KV_REVISION", "value": p} in vllm["env"]
        assert template["spec"]["readinessGates"] == [{"conditionType": "duplex.dev/kv-paired"}]
        assert objs[f"Service/demo-{role}"]["metadata"]["labels"]["duplex.dev/kv-revision"] == p
        # the selector never changes (it is immutable): revisions are told apart by the pods' label
        assert "duplex.dev/kv-revision" not in objs[f"Deployment/demo-{role}"]["spec"]["selector"]["matchLabels"]


def test_legacy_rendering_leaves_the_pods_as_they_were() -> None:
    objs = rendered(legacy=True)
    for role in ("prefill", "decode"):
        template = objs[f"Deployment/demo-{role}"]["spec"]["template"]
        assert "duplex.dev/kv-revision" not in template["metadata"]["labels"]
        assert "readinessGates" not in template["spec"]
        assert objs[f"Service/demo-{role}"]["metadata"]["labels"]["duplex.dev/kv-revision"] == ""


def _legacy(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The children as an operator from before revisions left them."""
    with monkeypatch.context() as m:
        m.setattr(sync_helpers, "desired_children", lambda *a, **k: desired_children(*a, **k, legacy=True))
        return sync_helpers.observed(parent())


def _deployments(result: Any) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in result.apply if o["kind"] == "Deployment"}


def test_an_operator_upgrade_rolls_no_engine_and_the_next_incompatible_change_stamps_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    live = _legacy(monkeypatch)
    assert not _deployments(sync(parent(), live, None, at="t"))  # nothing to roll
    compatible = sync(parent({"decode": {"cpu": "16", "memory": "64Gi"}}), live, None, at="t")
    decode = _deployments(compatible)["demo-decode"]["spec"]["template"]
    assert revision.of_template(decode) == "" and "demo-prefill" not in _deployments(compatible)
    incompatible = _deployments(sync(parent({"model": {"blockSize": 32}}), live, None, at="t"))
    revs = {
        revision.of_template(d["spec"]["template"])
        for d in incompatible.values()
        if "router" not in d["metadata"]["name"]
    }
    assert len(revs) == 1 and revs != {""} and set(incompatible) >= {"demo-prefill", "demo-decode"}
