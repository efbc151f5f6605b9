"""The chart's ClusterRole grants exactly what the operator needs (duplex.permissions.required(), derived from the
child-kind table, the parent API, Events, the router's Role and kopf): no more, no less, and nothing by wildcard."""

from __future__ import annotations

from typing import Any

import yaml
from dsv_helpers import REPO

from duplex.api.meta import GROUP, PLURAL
from duplex.children.kinds import CHILD_KINDS, SECRET
from duplex.permissions import Permission, required

CLUSTER_ROLE = REPO / "charts/duplex/files/clusterrole.yaml"


def cluster_role() -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(CLUSTER_ROLE.read_text()) if d]
    return doc


def granted(rules: list[dict[str, Any]]) -> list[Permission]:
    return [(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]]


def test_the_cluster_role_grants_exactly_what_the_operator_needs() -> None:
    role = cluster_role()
    assert (role["apiVersion"], role["kind"], role["metadata"]["name"]) == (
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        "duplex-operator",
    )
    have = set(granted(role["rules"]))
    need = required()
    assert not need - have, f"missing: {sorted(need - have)}"
    assert not have - need, f"more than needed: {sorted(have - need)}"


def test_no_wildcards_no_duplicates_no_other_rule_shapes() -> None:
    rules = cluster_role()["rules"]
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in rules)  # no resourceNames, URLs
    permissions = granted(rules)
    assert "*" not in {part for p in permissions for part in p}
    assert len(permissions) == len(set(permissions)), "a permission is granted twice"


def test_every_child_kind_in_the_table_is_covered() -> None:
    """Adding a kind to the table without its rule fails here (and the first test says which)."""
    need = required()
    for kind in CHILD_KINDS:
        if kind is SECRET:
            continue  # below
        assert {(kind.group, kind.plural, v) for v in ("list", "watch", "create", "delete", "patch")} <= need
        assert (kind.group, kind.plural, "get") not in need  # reads come from the watch


def test_secrets_are_created_and_read_by_name_never_listed_watched_or_changed() -> None:
    """The engine key must not rotate on a pass: no patch or update. And no list or watch (issue 23): on EKS those
    would read every Secret of the cluster, kube-system's included; each pass GETs the one Secret it names."""
    need = required()
    assert {v for g, r, v in need if (g, r) == ("", "secrets")} == {"get", "create"}
    assert (GROUP, PLURAL, "get") not in need and (GROUP, PLURAL, "update") not in need
