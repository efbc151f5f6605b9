"""Client API keys: with `client_keys_dir` set, completions and /v1/models need a key the router knows (401
otherwise, in each API's error shape), the key's name is the tenant, and a rotated key applies without a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from duplex_sidecars.router.client_auth import ClientKeys, presented_key
from duplex_sidecars.router.config import RouterConfig

USER = {"role": "user", "content": "hi"}


def keys_dir(tmp_path, **keys: str):
    d = tmp_path / "keys"
    d.mkdir(exist_ok=True)
    for tenant, key in keys.items():
        (d / tenant).write_text(key + "\n")
    return d


def test_keys_are_files_named_by_tenant(tmp_path):
    d = keys_dir(tmp_path, alice="key-a", bob="key-b")
    (d / "..data").mkdir()  # a mounted Secret's bookkeeping is not a key
    keys = ClientKeys(str(d))
    assert len(keys) == 2
    assert keys.tenant_for("key-a") == "alice" and keys.tenant_for("key-b") == "bob"
    assert keys.tenant_for("key-c") is None and keys.tenant_for("") is None and keys.tenant_for(None) is None
    (d / "alice").write_text("rotated")
    assert keys.refresh() and keys.tenant_for("key-a") is None and keys.tenant_for("rotated") == "alice"
    assert not keys.refresh()  # nothing changed since


def test_a_key_is_a_bearer_token_or_anthropics_header():
    assert presented_key("Bearer abc", None) == "abc"
    assert presented_key("bearer abc ", "x") == "abc"
    assert presented_key(None, "xyz") == "xyz"
    assert presented_key("Basic abc", None) is None


async def test_requests_need_a_known_key(make_rig, tmp_path):
    rig = await make_rig(client_keys_dir=str(keys_dir(tmp_path, alice="key-a")))
    status, body, _ = await rig.chat([USER])
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, _, _ = await rig.chat([USER], headers={"Authorization": "Bearer wrong"})
    assert status == 401
    status, _, _ = await rig.chat([USER], headers={"Authorization": "Bearer key-a"})
    assert status == 200
    assert rig.metric("duplex_router_rejected_requests_total", reason="unauthorized") == 2
    assert rig.p.seen and len(rig.p.seen) == 1  # refused requests never reached an engine
    async with rig.session.get(rig.url + "/v1/models") as resp:
        assert resp.status == 401
    async with rig.session.get(rig.url + "/health") as resp:
        assert resp.status == 200  # probes need no key
    status, body, _ = await rig.post("/v1/messages", {"model": "m", "max_tokens": 4, "messages": [USER]})
    assert status == 401 and body["type"] == "error" and body["error"]["type"] == "authentication_error"


async def test_the_key_names_the_tenant(make_rig, tmp_path):
    rig = await make_rig(client_keys_dir=str(keys_dir(tmp_path, alice="key-a", bob="key-b")))
    alice, bob = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    _, _, text = await rig.chat([USER], conv="shared-id", headers=alice)
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    await rig.chat(history, conv="shared-id", headers=bob)  # the same conversation id, another tenant
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 0
    await rig.chat(history, conv="shared-id", headers=alice)
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 1
    # a client's own credentials never reach an engine
    assert all("key-a" not in str(s.headers.get("Authorization")) for s in rig.p.seen + rig.d.seen)


def test_a_key_file_that_cannot_be_read_costs_only_its_tenant(tmp_path, monkeypatch):
    # A revoked key must stop working even when another file cannot be read at that moment (a Secret's files are
    # swapped under the reader); the unreadable one is read again next time.
    d = keys_dir(tmp_path, alice="key-a", bob="key-b")
    keys = ClientKeys(str(d))
    read_bytes = Path.read_bytes

    def flaky(path: Path) -> bytes:
        if path.name == "bob":
            raise PermissionError(13, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", flaky)
    (d / "alice").write_text("rotated")
    assert keys.refresh()
    assert keys.tenant_for("key-a") is None and keys.tenant_for("rotated") == "alice"
    assert keys.tenant_for("key-b") is None  # not read: refused, never stale
    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    assert keys.refresh() and keys.tenant_for("key-b") == "bob"


async def test_a_trusted_gateway_names_its_users_and_no_one_else_can(make_rig, tmp_path):
    keys = keys_dir(tmp_path, envoy="key-gw", ingress="key-gw2", alice="key-a")
    rig = await make_rig(client_keys_dir=str(keys), gateway={"keys": ["envoy", "ingress"]})
    gw = {"Authorization": "Bearer key-gw"}
    as_user = lambda user, base=gw: {**base, "X-Duplex-Tenant": user}  # noqa: E731

    status, body, _ = await rig.chat([USER], headers=gw)  # a gateway must say whose request it is
    assert status == 400 and body["error"]["code"] == "missing_tenant"
    status, body, _ = await rig.chat([USER], headers=as_user("u" * 257))
    assert status == 400 and body["error"]["code"] == "invalid_value"

    _, _, text = await rig.chat([USER], conv="c1", headers=as_user("user-1"))
    history = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
    for other in (as_user("user-2"), as_user("user-1", {"Authorization": "Bearer key-gw2"})):
        await rig.chat(history, conv="c1", headers=other)  # another user, or the same name through another gateway
    # a plain client key cannot claim a gateway's user: its header is ignored and its tenant is its key's
    await rig.chat(history, conv="c1", headers=as_user("user-1", {"Authorization": "Bearer key-a"}))
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 0
    await rig.chat(history, conv="c1", headers=as_user("user-1"))
    assert rig.metric("duplex_router_kv_reuse_hits_total") == 1
    assert not [k for s in rig.p.seen + rig.d.seen for k in s.headers if k.lower() == "x-duplex-tenant"]


def test_a_gateway_is_known_by_its_client_key():
    with pytest.raises(ValidationError, match="gateway needs client_keys_dir"):
        RouterConfig.model_validate({"gateway": {"keys": ["envoy"]}})
