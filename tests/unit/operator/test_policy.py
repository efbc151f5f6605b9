"""What the cluster's administrator lets a DisaggregatedServing ask for beyond its CRD (duplex.policy): privileged
engines and hostPath caches are refused unless the operator is told otherwise, like an invalid spec."""

from __future__ import annotations

from typing import Any

import pytest
from dsv_helpers import spec
from sync_helpers import LIVE, READY, T1, parent

from duplex import operator_cli
from duplex.policy import Policy
from duplex.sync import Event, sync

PRIVILEGED = {
    "network": {"efa": {"enabled": True, "privileged": True}},
    "prefill": {"memory": "1Gi"},
    "decode": {"memory": "1Gi"},
}


def host_path(path: str) -> dict[str, Any]:
    return {"model": {"cache": {"hostPath": {"path": path}}}}


def test_by_default_privileged_engines_and_host_paths_are_refused() -> None:
    (privileged,) = Policy().violations(spec(PRIVILEGED))
    assert privileged.startswith("spec.network.efa.privileged:") and "--allow-privileged-efa" in privileged
    (cache,) = Policy().violations(spec(host_path("/mnt/raid0")))
    assert cache.startswith("spec.model.cache.hostPath.path: /mnt/raid0") and "allowed: none" in cache
    assert Policy().violations(spec()) == []


def test_an_administrator_allows_them() -> None:
    assert Policy(allow_privileged_efa=True).violations(spec(PRIVILEGED)) == []
    assert Policy(host_path_prefixes=("/mnt",)).violations(spec(host_path("/mnt/raid0/models"))) == []


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/mnt", True),
        ("/mnt/raid0", True),
        ("/mnt/raid0/", True),
        ("/mntx", False),  # a prefix matches whole components
        ("/mnt/../etc", False),
        ("/mnt/./raid0", False),
        ("/mnt//raid0", False),
        ("/etc", False),
    ],
)
def test_host_paths_match_whole_components_of_a_plain_path(path: str, allowed: bool) -> None:
    assert Policy(host_path_prefixes=("/mnt",)).allows_host_path(path) is allowed


def test_an_administrator_can_limit_images_to_registries() -> None:
    assert Policy().violations(spec({"model": {"image": "evil.example/vllm:1"}})) == []  # none given: any image
    ecr = Policy(image_prefixes=("123456789012.dkr.ecr.us-west-2.amazonaws.com/", "ghcr.io/duplex-dev/"))
    ok = spec({"model": {"image": "123456789012.dkr.ecr.us-west-2.amazonaws.com/vllm:0.33"}})
    assert ecr.violations(ok) == []  # router and preflight images default to ghcr.io/duplex-dev/duplex
    (refused,) = ecr.violations(spec({"model": {"image": "evil.example/vllm:1"}}))
    assert (
        refused.startswith("spec.model.image: evil.example/vllm:1 is not from a registry")
        and "--allow-image" in refused
    )


def test_sync_refuses_what_the_policy_does_not_allow_and_leaves_the_children() -> None:
    result = sync(parent(PRIVILEGED), LIVE, READY, at=T1)
    assert result.invalid and "--allow-privileged-efa" in result.invalid
    assert result.apply == result.delete == result.create == []
    assert result.events == [Event("Warning", "ConfigInvalid", result.invalid)]
    allowed = sync(parent(PRIVILEGED), LIVE, READY, at=T1, policy=Policy(allow_privileged_efa=True))
    assert allowed.invalid is None


def test_the_operator_refuses_a_host_path_prefix_that_is_not_a_plain_absolute_path() -> None:
    # The flags' way to the workers is checked with the chart's rendered args (tests/unit/test_chart_render.py).
    for prefix in ("relative/dir", "/mnt/../etc"):
        with pytest.raises(SystemExit):
            operator_cli.main(["--allow-host-path", prefix])


SECRETS = {
    "model": {
        "hfTokenSecret": {"name": "hf-token", "key": "token"},
        "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "p"}}}],
    },
    "decode": {"env": [{"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]},
    "router": {
        "replicas": 2,
        "clientKeysSecret": "client-keys",
        "store": {"type": "redis", "redis": {"urlSecret": {"name": "redis-url", "key": "url"}}},
    },
}


def test_secrets_a_serving_reads_are_any_by_default_and_only_the_allowed_ones_when_listed() -> None:
    assert Policy().violations(spec(SECRETS)) == []
    listed = Policy(secret_names=("hf-token", "redis-url", "client-keys"))
    (refused,) = listed.violations(spec(SECRETS))
    assert refused.startswith("spec.model.env[0].valueFrom.secretKeyRef: Secret db-password is not one")
    assert "--allow-secret" in refused and "policy.allowedSecrets" in refused
    narrow = Policy(secret_names=("db-password",)).violations(spec(SECRETS))
    assert [v.split(":")[0] for v in narrow] == [
        "spec.model.hfTokenSecret",
        "spec.router.store.redis.urlSecret",
        "spec.router.clientKeysSecret",
    ]


def tolerating(*tolerations: dict[str, Any]) -> Any:
    return spec({"prefill": {"tolerations": list(tolerations)}})


def test_tolerations_are_refused_unless_their_taint_key_is_allowed() -> None:
    dedicated = {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    everything = {"operator": "Exists"}
    (refused,) = Policy().violations(tolerating(dedicated))
    assert (
        refused.startswith("spec.prefill.tolerations[0]: taint key dedicated is not one") and "allowed: none" in refused
    )
    assert Policy().violations(spec()) == []  # the accelerator taints duplex tolerates itself are not the user's
    assert Policy(toleration_keys=("dedicated",)).violations(tolerating(dedicated)) == []
    (keyless,) = Policy(toleration_keys=("dedicated",)).violations(tolerating(dedicated, everything))
    assert keyless.startswith("spec.prefill.tolerations[1]: a toleration without a key (every taint)")
    assert Policy(toleration_keys=("*",)).violations(tolerating(dedicated, everything)) == []
