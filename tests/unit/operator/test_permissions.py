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
        assert {(kind.group, kind.plural, v) for v in ("list", "watch", "create", "delete")} <= need
        # Reads come from the watch; the one GET is the key Secret's, when its create finds the name taken.
        assert ((kind.group, kind.plural, "get") in need) == (kind is SECRET)
        assert ((kind.group, kind.plural, "patch") in need) == (kind is not SECRET)


def test_secrets_are_created_never_changed_or_read_one_by_one() -> None:
    """The engine key must not rotate on a pass: the operator cannot patch or update Secrets. It may GET one (list and
    watch read them anyway) to tell its own from someone else's of the same name (reconcile._create_once)."""
    need = required()
    assert {v for g, r, v in need if (g, r) == ("", "secrets")} == {"list", "watch", "get", "create", "delete"}
    assert (GROUP, PLURAL, "get") not in need and (GROUP, PLURAL, "update") not in need
