"""`duplex render -f FILE`: the examples render the expected objects deterministically; bad input fails with the
rule's words on stderr and nothing on stdout."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dsv_helpers import REPO, SEED, TRAINIUM, arg_value, container, doc, env_map, find, load, spec_dict

from duplex import render_cli
from duplex.render import desired_children, parse
from duplex.yamlio import dump_all

KINDS = [
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ConfigMap",
    "ConfigMap",
    "ConfigMap",
    "Service",
    "Service",
    "Service",
    "Service",
    "NetworkPolicy",
    "NetworkPolicy",
    "NetworkPolicy",
    "Deployment",
    "Deployment",
    "Deployment",
]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = render_cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def render_file(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict[str, Any]]:
    code, out, err = run(["-f", str(path), *extra], capsys)
    assert code == 0, err
    assert err == ""
    return list(yaml.safe_load_all(out))


def write(tmp_path: Path, docs: list[Any], name: str = "in.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs))
    return path


# --- the real entry point ---------------------------------------------------------------------------------------


def _duplex(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duplex.cli", *args], input=stdin, capture_output=True, text=True, cwd=REPO, timeout=60
    )


def test_duplex_render_seed_exits_zero_and_is_deterministic_across_processes() -> None:
    first, second = _duplex("render", "-f", str(SEED)), _duplex("render", "-f", str(SEED))
    assert first.returncode == 0 and second.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert first.stderr == ""
    assert [o["kind"] for o in yaml.safe_load_all(first.stdout)] == KINDS


def test_duplex_render_invalid_exits_nonzero_with_the_rule_message_on_stderr(tmp_path: Path) -> None:
    bad = load(SEED)
    bad["spec"]["router"]["conversation"]["ttl"] = 480
    result = _duplex("render", "-f", str(write(tmp_path, [bad])))
    assert result.returncode != 0
    assert result.stdout == ""
    assert (
        'DisaggregatedServing "qwen3-32b" is invalid: spec: router.conversation.ttl must be strictly below '
        "kvTransfer.decodeBlocksTTL"
    ) in result.stderr


# --- the examples -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", [SEED, TRAINIUM], ids=["seed", "trainium"])
def test_example_renders_the_expected_objects_in_apply_order(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    objs = render_file(example, capsys)
    name = load(example)["metadata"]["name"]
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        ("ServiceAccount", f"{name}-router"),
        ("Role", f"{name}-router"),
        ("RoleBinding", f"{name}-router"),
        ("ConfigMap", f"{name}-router"),
        ("ConfigMap", f"{name}-fabric"),
        ("ConfigMap", f"{name}-guard"),
        ("Service", f"{name}-prefill"),
        ("Service", f"{name}-decode"),
        ("Service", f"{name}-router"),
        ("Service", f"{name}-drain"),
        ("NetworkPolicy", f"{name}-prefill"),
        ("NetworkPolicy", f"{name}-decode"),
        ("NetworkPolicy", f"{name}-router"),
        ("Deployment", f"{name}-prefill"),
        ("Deployment", f"{name}-decode"),
        ("Deployment", f"{name}-router"),
    ]
    assert all(o["metadata"]["namespace"] == "default" for o in objs)
    assert objs == desired_children(parse(load(example)))


@pytest.mark.parametrize("example", [SEED, TRAINIUM], ids=["seed", "trainium"])
def test_rendering_twice_is_byte_identical(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outputs = [run(["-f", str(example)], capsys)[1] for _ in range(2)]
    assert outputs[0] == outputs[1] != ""


def test_seed_engines(capsys: pytest.CaptureFixture[str]) -> None:
    objs = render_file(SEED, capsys)
    for role in ("prefill", "decode"):
        ctr = container(find(objs, "Deployment", f"qwen3-32b-{role}"))
        args = ctr["args"]
        assert args[0] == "Qwen/Qwen3-32B"
        assert arg_value(args, "--tensor-parallel-size") == "8"
        assert arg_value(args, "--served-model-name") == "Qwen"
        assert arg_value(args, "--max-model-len") == "32768"
        assert arg_value(args, "--max-num-seqs") == "8"
        limits = ctr["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "8" and limits["vpc.amazonaws.com/efa"] == "16"
        assert limits["hugepages-2Mi"] == "5120Mi" and limits["memory"] == "1000Gi" and limits["cpu"] == "96"
        assert ctr["resources"]["requests"] == limits
        kv = json.loads(arg_value(args, "--kv-transfer-config"))
        extra = kv["kv_connector_extra_config"]
        assert extra["backends"] == ["LIBFABRIC"]
        assert extra["bidirectional_kv_xfer"] is True
        assert extra["decoder_kv_blocks_ttl"] == 480
        assert extra["kv_recompute_threshold"] == 64
        assert kv["kv_buffer_device"] == "cuda"
        env = env_map(ctr)
        assert env["FI_PROVIDER"]["value"] == "efa"
        assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
        assert "IPC_LOCK" in ctr["securityContext"]["capabilities"]["add"]
        pod = find(objs, "Deployment", f"qwen3-32b-{role}")["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5en.48xlarge"}
    router_json = json.loads(find(objs, "ConfigMap", "qwen3-32b-router")["data"]["router.json"])
    assert router_json["conversation"]["ttl_seconds"] == 450.0
    assert router_json["conversation"]["engine_blocks_ttl_seconds"] == 480.0
    assert router_json["store"]["kind"] == "memory"


def test_trainium_engines(capsys: pytest.CaptureFixture[str]) -> None:
    objs = render_file(TRAINIUM, capsys)
    for role in ("prefill", "decode"):
        d = find(objs, "Deployment", f"llama-70b-trn2-{role}")
        ctr = container(d)
        limits = ctr["resources"]["limits"]
        assert limits["aws.amazon.com/neuron"] == "16" and "nvidia.com/gpu" not in limits
        assert limits["vpc.amazonaws.com/efa"] == "16"
        assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in d["spec"]["template"][
            "spec"
        ]["tolerations"]
        kv = json.loads(arg_value(ctr["args"], "--kv-transfer-config"))
        assert kv["kv_buffer_device"] == "cpu"
        assert kv["kv_connector_extra_config"]["backends"] == ["LIBFABRIC"]
        assert kv["kv_connector_extra_config"]["decoder_kv_blocks_ttl"] == 600
        assert kv["kv_connector_extra_config"]["kv_recompute_threshold"] == 128
        assert arg_value(ctr["args"], "--tensor-parallel-size") == "32"
        assert arg_value(ctr["args"], "--block-size") == "32"
    router = find(objs, "Deployment", "llama-70b-trn2-router")
    assert router["spec"]["replicas"] == 2
    assert env_map(container(router))["DUPLEX_REDIS_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "duplex-redis", "key": "url"}
    }
    router_json = json.loads(find(objs, "ConfigMap", "llama-70b-trn2-router")["data"]["router.json"])
    assert router_json["store"]["kind"] == "redis" and router_json["store"]["redis_url_env"] == "DUPLEX_REDIS_URL"
    assert router_json["conversation"]["ttl_seconds"] == 570.0


# --- options and inputs -----------------------------------------------------------------------------------------


def test_namespace_option_and_document_namespace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, [doc(spec_dict(), name="a"), doc(spec_dict(), name="b", namespace="pinned")])
    objs = render_file(path, capsys, "-n", "team")
    assert {o["metadata"]["namespace"] for o in objs if o["metadata"]["name"].startswith("a-")} == {"team"}
    assert {o["metadata"]["namespace"] for o in objs if o["metadata"]["name"].startswith("b-")} == {"pinned"}


def test_several_servings_in_one_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(
        tmp_path,
        [load(SEED), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}, load(TRAINIUM), None],
    )
    objs = render_file(path, capsys)
    assert len(objs) == 32
    assert [o["metadata"]["name"] for o in objs[:16]] == [
        o["metadata"]["name"] for o in desired_children(parse(load(SEED)))
    ]
    assert objs[16]["metadata"]["name"] == "llama-70b-trn2-router"
    assert not any(o["kind"] == "Namespace" for o in objs)


def test_one_invalid_document_fails_the_whole_render(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = doc(spec_dict({"prefill": {"tensorParallelSize": 8}}), name="broken")
    path = write(tmp_path, [load(SEED), bad])
    code, out, err = run(["-f", str(path)], capsys)
    assert code == 1 and out == ""
    assert err == (
        'DisaggregatedServing "broken" is invalid: spec: decode.tensorParallelSize must be >= '
        "prefill.tensorParallelSize (NixlConnector limitation); set kvTransfer.allowDecodeTPBelowPrefill "
        "to override\n"
    )


def test_every_error_of_every_document_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = [
        doc(spec_dict({"prefill": {"replicas": -1}, "decode": {"bogus": 1}}), name="one"),
        doc(spec_dict({"model": {"extraArgs": ["--port=9000"]}}), name="Two"),
    ]
    code, out, err = run(["-f", str(write(tmp_path, docs))], capsys)
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert any(line.startswith('DisaggregatedServing "one" is invalid: spec.prefill.replicas: ') for line in lines)
    assert 'DisaggregatedServing "one" is invalid: spec.decode.bogus: unknown field "bogus"' in lines
    assert any(
        line.startswith('DisaggregatedServing "Two" is invalid: metadata.name must be a DNS-1035 label')
        for line in lines
    )
    assert any(
        line.startswith('DisaggregatedServing "Two" is invalid: spec.model.extraArgs: --port is set by duplex')
        for line in lines
    )


def test_file_without_a_serving(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}])
    code, out, err = run(["-f", str(path)], capsys)
    assert code == 1 and out == ""
    assert err == f"duplex render: {path} holds no DisaggregatedServing\n"
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    code, out, err = run(["-f", str(empty)], capsys)
    assert code == 1 and out == "" and "holds no DisaggregatedServing" in err


def test_wrong_api_version_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = doc(spec_dict(), name="v")
    d["apiVersion"] = "duplex.dev/v2"
    code, out, err = run(["-f", str(write(tmp_path, [d]))], capsys)
    assert code == 1 and out == ""
    assert "expected apiVersion duplex.dev/v1alpha1 kind DisaggregatedServing, got duplex.dev/v2" in err


def test_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.yaml"
    code, out, err = run(["-f", str(missing)], capsys)
    assert code == 1 and out == ""
    assert err.startswith(f"duplex render: cannot read {missing}: ")
    code, out, err = run(["-f", str(tmp_path)], capsys)  # a directory
    assert code == 1 and out == "" and err.startswith("duplex render: cannot read")


def test_malformed_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: [unclosed\n")
    code, out, err = run(["-f", str(path)], capsys)
    assert code == 1 and out == "" and err.startswith(f"duplex render: cannot read {path}: ")


def test_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(SEED.read_text()))
    code, out, err = run(["-f", "-"], capsys)
    assert code == 0 and err == ""
    assert list(yaml.safe_load_all(out)) == desired_children(parse(load(SEED)))
    monkeypatch.setattr(sys, "stdin", io.StringIO("kind: Nothing\n"))
    code, out, err = run(["-f", "-"], capsys)
    assert code == 1 and out == "" and err == "duplex render: - holds no DisaggregatedServing\n"


def test_filename_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        render_cli.main([])
    assert info.value.code == 2
    assert "-f" in capsys.readouterr().err


def test_output_is_the_yaml_stream_of_the_children(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["-f", str(SEED)], capsys)
    assert code == 0
    assert out == dump_all(desired_children(parse(load(SEED))))
    assert "&id" not in out and "*id" not in out  # no YAML aliases
    assert out.count("\n---\n") == 15
