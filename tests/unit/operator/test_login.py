"""`duplex operator --kubeconfig` logs in as the kubeconfig's user: a ServiceAccount token in a kubeconfig reaches
kopf (kubernetes >= 36 keeps it under api_key["BearerToken"]; reading it elsewhere made the operator anonymous)."""

from __future__ import annotations

import yaml

from duplex import handlers


def test_a_token_kubeconfig_logs_in_with_its_token(tmp_path, monkeypatch):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "sa", "user": {"token": "the-service-account-token"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "sa"}}],
        "current-context": "x",
    }))  # fmt: skip
    monkeypatch.setenv("DUPLEX_KUBECONFIG", str(kubeconfig))
    info = handlers.login()
    assert info is not None
    assert info.token == "the-service-account-token"
    assert info.server == "https://127.0.0.1:6443"
