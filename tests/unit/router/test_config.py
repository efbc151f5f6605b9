"""Config file + flags: flags win, YAML and JSON both work, invalid files are refused at start and ignored on reload."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
import yaml

from duplex_sidecars.router import cli
from duplex_sidecars.router.app import Router
from duplex_sidecars.router.config import RouterConfig
from duplex_sidecars.router.config_file import ConfigError, ConfigSource, deep_merge, flag_overrides


def args(*argv: str):
    return cli.build_parser().parse_args(list(argv))


def test_flags_only():
    cfg = cli.source_from_args(
        args(
            "--prefill",
            "http://p1:8000",
            "--prefill",
            "p2:8000",
            "--decode",
            "http://d1:8000",
            "--port",
            "9000",
            "--host",
            "127.0.0.1",
            "--conversation-ttl",
            "100",
        )
    ).load()
    assert cfg.prefill == ["http://p1:8000", "p2:8000"] and cfg.decode == ["http://d1:8000"]
    assert (cfg.host, cfg.port, cfg.conversation.ttl_seconds) == ("127.0.0.1", 9000, 100)


def test_flags_override_the_file(tmp_path):
    path = tmp_path / "router.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "port": 7000,
                "prefill": ["http://file-p"],
                "decode": ["http://file-d"],
                "conversation": {"ttl_seconds": 200, "header": "X-Session"},
                "store": {"max_entries": 10},
            }
        )
    )
    cfg = cli.source_from_args(
        args("--config", str(path), "--prefill", "http://flag-p", "--conversation-ttl", "300")
    ).load()
    assert cfg.prefill == ["http://flag-p"] and cfg.decode == ["http://file-d"]
    assert cfg.port == 7000 and cfg.conversation.ttl_seconds == 300 and cfg.conversation.header == "X-Session"
    assert cfg.store.max_entries == 10


def test_json_files_work_and_engine_flags_switch_discovery_off(tmp_path):
    path = tmp_path / "router.json"
    path.write_text(json.dumps({"discovery": {"namespace": "ns", "prefill_service": "p", "decode_service": "d"}}))
    assert ConfigSource(str(path)).load().discovery is not None
    cfg = ConfigSource(str(path), flag_overrides(decode=["http://d"])).load()
    assert cfg.discovery is None and cfg.decode == ["http://d"]


@pytest.mark.parametrize(
    "text",
    [
        "port: [1",  # YAML syntax
        "- a\n- b",  # not a mapping
        "bogus_field: 1",  # extra=forbid
        "conversation: {ttl_seconds: 500}",  # not below the engines' 480 s
        "port: 0",
        "store: {kind: redis}",  # redis without a URL
    ],
)
def test_invalid_files_are_refused(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        ConfigSource(str(path)).load()
    assert cli.main(["--config", str(path)]) == 2


def test_ttl_flag_is_validated_against_the_engine_ttl():
    assert cli.main(["--prefill", "http://p", "--decode", "http://d", "--conversation-ttl", "600"]) == 2


def test_missing_file_is_an_error(tmp_path):
    assert cli.main(["--config", str(tmp_path / "nope.yaml")]) == 2


def test_deep_merge():
    assert deep_merge({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": 3}, "l": [2]}) == {"a": {"b": 3, "c": 2}, "l": [2]}


def test_change_detection_ignores_touches(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("port: 8001\n")
    source = ConfigSource(str(path))
    source.load()
    assert not source.changed()
    os.utime(path, ns=(1, 1))
    assert not source.changed()  # same content
    path.write_text("port: 8002\n")
    os.utime(path, ns=(2, 2))
    assert source.changed()
    assert source.load().port == 8002


async def test_reload_applies_valid_files_and_ignores_invalid_ones(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "prefill": ["http://127.0.0.1:9"],
                "decode": ["http://127.0.0.1:10"],
                "reload_interval_seconds": 0.05,
                "health_check": {"interval_seconds": 60, "timeout_seconds": 0.2},
            }
        )
    )
    source = ConfigSource(str(path), flag_overrides(conversation_ttl=100))
    router = Router(source.load(), source)
    await router.start()
    try:

        def write(data) -> None:
            path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
            st = path.stat()
            os.utime(path, ns=(st.st_mtime_ns + 10**9, st.st_mtime_ns + 10**9))

        write(
            {
                "prefill": ["http://127.0.0.1:9"],
                "decode": ["http://127.0.0.1:11", "http://127.0.0.1:12"],
                "reload_interval_seconds": 0.05,
                "max_body_bytes": 1234,
                "health_check": {"interval_seconds": 60, "timeout_seconds": 0.2},
            }
        )
        for _ in range(100):
            if router.generation == 2:
                break
            await asyncio.sleep(0.02)
        assert router.generation == 2
        assert sorted(router.engines.decode.engines) == ["http://127.0.0.1:11", "http://127.0.0.1:12"]
        assert router.config.max_body_bytes == 1234
        assert router.config.conversation.ttl_seconds == 100  # the flag still wins
        write("decode: [oops")
        await asyncio.sleep(0.3)
        assert router.generation == 2 and router.config.max_body_bytes == 1234
        assert (
            router.metrics.registry.get_sample_value("duplex_router_config_reloads_total", {"outcome": "invalid"}) == 1
        )
    finally:
        await router.stop()


def test_config_model_additions_have_defaults():
    cfg = RouterConfig()
    assert cfg.health_check.path == "/health" and cfg.store.op_timeout_seconds > 0
    assert cfg.discovery is None and cfg.engine_api_key_env is None


async def test_reload_applies_memory_store_bounds_without_a_restart(caplog):
    base = {"prefill": ["http://127.0.0.1:9"], "decode": ["http://127.0.0.1:10"]}
    router = Router(RouterConfig.model_validate(base))
    lowered = RouterConfig.model_validate({**base, "store": {"max_entries": 7, "max_bytes": 1 << 20}})
    with caplog.at_level("WARNING"):
        await router.apply(lowered)
    assert (router.store.max_entries, router.store.max_bytes) == (7, 1 << 20)
    assert "restart" not in caplog.text
    with caplog.at_level("WARNING"):
        await router.apply(
            RouterConfig.model_validate({**base, "store": {"kind": "redis", "redis_url": "redis://127.0.0.1:1"}})
        )
    assert "store backend changes take effect after a restart" in caplog.text
    assert router.store.kind == "memory"
    await router.stop()


async def test_maintenance_keeps_the_store_gauges_current(monkeypatch):
    from duplex_sidecars.router import app as app_module
    from duplex_sidecars.router.history import Covered
    from duplex_sidecars.router.store import Entry

    monkeypatch.setattr(app_module, "_MAINTENANCE_SECONDS", 0.02)
    router = Router(
        RouterConfig.model_validate(
            {
                "prefill": ["http://127.0.0.1:9"],
                "decode": ["http://127.0.0.1:10"],
                "health_check": {"interval_seconds": 60, "timeout_seconds": 0.2},
            }
        )
    )
    await router.start()
    try:
        # Entries put behind the request path's back (as a reload's eviction or expiry changes them).
        e = Entry(
            decode_url="http://127.0.0.1:10",
            params={"remote_engine_id": "d", "remote_num_tokens": 1},
            covered=Covered("messages", "abc", 3),
            scope="s",
        )
        await router.store.put("k", e, ttl=60)
        sample = router.metrics.registry.get_sample_value
        for _ in range(100):
            if sample("duplex_router_store_bytes") == router.store.bytes_held() > 0:
                break
            await asyncio.sleep(0.02)
        assert sample("duplex_router_store_bytes") == router.store.bytes_held() > 0
        assert sample("duplex_router_store_entries") == 1
    finally:
        await router.stop()


def _reloading(path, **config) -> dict:
    return {
        "prefill": ["http://127.0.0.1:9"],
        "decode": ["http://127.0.0.1:10"],
        "reload_interval_seconds": 0.05,
        "health_check": {"interval_seconds": 60, "timeout_seconds": 0.2},
        **config,
    }


def _write(path, data: dict) -> None:
    path.write_text(yaml.safe_dump(data))
    st = path.stat()
    os.utime(path, ns=(st.st_mtime_ns + 10**9, st.st_mtime_ns + 10**9))


async def _eventually(condition, timeout: float = 5.0) -> bool:
    for _ in range(int(timeout / 0.02)):
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


async def test_a_reload_that_fails_while_applying_is_logged_and_applied_next_round(tmp_path, caplog):
    # An endpoint change that raises once must not leave the change unapplied for good: the file is read again.
    path = tmp_path / "r.yaml"
    _write(path, _reloading(path))
    source = ConfigSource(str(path))
    router = Router(source.load(), source)
    await router.start()
    try:
        use_endpoints, failures = router._use_endpoints, [RuntimeError("injected endpoint failure")]

        async def flaky(config: RouterConfig) -> None:
            if failures:
                raise failures.pop()
            await use_endpoints(config)

        router._use_endpoints = flaky  # type: ignore[method-assign]
        _write(path, _reloading(path, decode=["http://127.0.0.1:11"]))
        assert await _eventually(lambda: list(router.engines.decode.engines) == ["http://127.0.0.1:11"])
        assert not failures and "injected endpoint failure" in caplog.text
        reloads = router.metrics.registry.get_sample_value
        assert reloads("duplex_router_config_reloads_total", {"outcome": "failed"}) == 1
        assert reloads("duplex_router_config_reloads_total", {"outcome": "applied"}) == 1
    finally:
        await router.stop()


async def test_a_client_keys_refresh_that_fails_does_not_stop_config_reloads(tmp_path, caplog):
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "alice").write_text("key-a")
    path = tmp_path / "r.yaml"
    _write(path, _reloading(path, client_keys_dir=str(keys)))
    source = ConfigSource(str(path))
    router = Router(source.load(), source)
    await router.start()
    try:
        client_keys = router.live.client_keys
        assert client_keys is not None and client_keys.tenant_for("key-a") == "alice"
        refresh = client_keys.refresh

        def broken() -> bool:
            raise RuntimeError("injected keys failure")

        client_keys.refresh = broken  # type: ignore[method-assign]
        _write(path, _reloading(path, client_keys_dir=str(keys), max_body_bytes=4321))
        assert await _eventually(lambda: router.config.max_body_bytes == 4321)
        assert "injected keys failure" in caplog.text
        # and once the keys read again, a revoked key stops working
        client_keys.refresh = refresh  # type: ignore[method-assign]
        (keys / "alice").unlink()
        assert await _eventually(lambda: router.live.client_keys is not None and not len(router.live.client_keys))
    finally:
        await router.stop()
