#!/usr/bin/env python3
"""Checks engine command lines with vLLM's own CLI parser and config classes; runs inside the vLLM virtualenv.

stdin:  JSON list of {"name": str, "argv": ["vllm", "serve", MODEL, ...],
                      optional "device": "cuda" | "cpu" | "xpu" | "tpu" | other (the engine's accelerator),
                      optional "hf_config": {...} (config.json for the model; else a built-in shape is used)}
stdout: JSON list of {"name", "ok", "model", "errors", "checks", "warnings", "kv_transfer_config", "engine_config"}
exit:   0 only if every entry is ok (an empty list is not), 1 if any is not, 2 on bad input.

Each entry goes through what `vllm serve` itself does before it starts any process: the `vllm` top-level parser with
the serve subcommand (`ServeSubcommand.subparser_init` -> `make_arg_parser`), `validate_parsed_serve_args`, the
positional model tag taking precedence over `--model`, `AsyncEngineArgs.from_cli_args` and `create_engine_config`.
Then it builds the scheduler side of the NixlConnector from that VllmConfig, so vLLM's own code reads our extra
config keys. The model is replaced by a local folder holding only a config.json (no weights, no network).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

# Before anything imports vllm: pick the CPU platform, stay offline, keep vLLM's log lines off stdout.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

EXPECTED_CONNECTOR = "NixlConnector"
# Keys our operator always sets, with the Python types vLLM's NIXL code treats them as (it does not coerce most).
REQUIRED_EXTRA: dict[str, tuple[type, ...]] = {
    "bidirectional_kv_xfer": (bool,),
    "kv_recompute_threshold": (int,),
    "decoder_kv_blocks_ttl": (int, float),
    "kv_lease_duration": (int,),
    "backends": (list,),
}

# config.json shapes (from the models' published config.json) so that head counts, layer counts and max positions
# meet the same divisibility and length checks as the real model. Keyed by the lower-cased repo name.
_QWEN3_32B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "vocab_size": 151936,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 64,
    "torch_dtype": "bfloat16",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
_LLAMA_33_70B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "pretraining_tp": 1,
    "torch_dtype": "bfloat16",
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
}
# Kimi K2 is DeepSeek-V3's architecture (MLA, 384 routed experts); its config.json names model_type kimi_k2, which
# only its remote code knows: the stand-in says deepseek_v3 and leaves out the FP8 quantization block.
_KIMI_K2 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "first_k_dense_replace": 1,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.827,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 131072,
    "vocab_size": 163840,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 163584,
    "eos_token_id": 163585,
}
MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-32b": _QWEN3_32B,
    "llama-3.3-70b-instruct": _LLAMA_33_70B,
    "kimi-k2-instruct": _KIMI_K2,
}


class _Records(logging.Handler):
    """Collects vLLM's WARNING+ log lines for one entry (deprecations show up there, not as errors)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")

    def listen(self) -> None:
        # create_engine_config re-runs vLLM's logging dictConfig, which drops foreign handlers: attach again after it.
        logger = logging.getLogger("vllm")
        if self not in logger.handlers:
            logger.addHandler(self)


class Entry:
    def __init__(self, name: str) -> None:
        self.name = name
        self.errors: list[str] = []
        self.checks: list[dict[str, str]] = []

    def passed(self, check: str, detail: str = "") -> None:
        self.checks.append({"check": check, "status": "passed", "detail": detail})

    def failed(self, check: str, detail: str) -> None:
        self.checks.append({"check": check, "status": "failed", "detail": detail})
        self.errors.append(f"{check}: {detail}")

    def skipped(self, check: str, detail: str) -> None:
        self.checks.append({"check": check, "status": "skipped", "detail": detail})


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _model_shape(model: str, override: dict[str, Any] | None) -> tuple[dict[str, Any], str]:
    if override:
        return override, "hf_config given with the entry"
    key = model.rstrip("/").rsplit("/", 1)[-1].lower()
    if key in MODEL_SHAPES:
        return MODEL_SHAPES[key], f"built-in config.json shape for {key}"
    return _QWEN3_32B, f"no built-in shape for {model!r}; used the Qwen3-32B shape"


def _nixl_extra_keys_read_by_vllm() -> set[str]:
    """Every kv_connector_extra_config key the installed NixlConnector code reads, found in vLLM's own source."""
    import vllm.distributed.kv_transfer.kv_connector.v1.nixl as nixl_pkg

    pattern = re.compile(r"""(?:get_from_extra_config|kv_connector_extra_config\.get)\(\s*["'](\w+)["']""")
    keys: set[str] = set()
    for path in Path(nixl_pkg.__file__).parent.glob("*.py"):
        keys.update(pattern.findall(path.read_text()))
    return keys


def _serve_parser() -> tuple[Any, Any]:
    """The `vllm` top-level parser with only the serve subcommand, built the way vllm.entrypoints.cli.main does."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand()
    serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
    return parser, serve


def _parse(entry: Entry, argv: list[str]) -> Any | None:
    if len(argv) < 2 or Path(argv[0]).name != "vllm" or argv[1] != "serve":
        entry.failed("argv", f"expected the command line to start with 'vllm serve', got {argv[:2]}")
        return None
    entry.passed("argv", "starts with 'vllm serve'")
    parser, serve = _serve_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(list(argv[1:]))
    except SystemExit:
        text = err.getvalue()
        text = text.split(": error: ", 1)[1] if ": error: " in text else text  # drop argparse's usage banner
        message = " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
        entry.failed("parse", f"vllm serve's argument parser rejected it: {message or 'exit without a message'}")
        return None
    except Exception as e:  # FlexibleArgumentParser raises ValueError for some layouts
        entry.failed("parse", f"vllm serve's argument parser rejected it: {type(e).__name__}: {e}")
        return None
    entry.passed("parse", "vllm CLI parser + ServeSubcommand.subparser_init (make_arg_parser)")
    try:
        serve.validate(args)
    except Exception as e:
        entry.failed("validate_parsed_serve_args", f"{type(e).__name__}: {e}")
        return None
    entry.passed("validate_parsed_serve_args")
    # As ServeSubcommand.cmd does: the positional model tag wins over --model.
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    return args


def _check_kv_transfer(entry: Entry, kv: Any, device: str | None) -> None:
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if kv is None:
        entry.failed("kv_transfer_config", "no --kv-transfer-config on the command line")
        return
    if not isinstance(kv, KVTransferConfig):
        entry.failed("kv_transfer_config", f"parser produced {type(kv).__name__}, not KVTransferConfig")
        return
    # Round-trip through the constructor: __post_init__ checks kv_role and that a role is set with a connector.
    try:
        KVTransferConfig(**{f.name: getattr(kv, f.name) for f in dataclasses.fields(kv)})
    except Exception as e:
        entry.failed("kv_transfer_config", f"KVTransferConfig rejects it: {e}")
        return
    entry.passed(
        "kv_transfer_config",
        f"KVTransferConfig(kv_role={kv.kv_role!r}, is_kv_transfer_instance={kv.is_kv_transfer_instance})",
    )
    if kv.kv_connector != EXPECTED_CONNECTOR:
        entry.failed("kv_connector", f"expected {EXPECTED_CONNECTOR!r}, got {kv.kv_connector!r}")
    else:
        try:
            cls = KVConnectorFactory.get_connector_class(kv)
            # Bidirectional transfer only works with the pull (READ) connector (vLLM PR #46473).
            if "Pull" not in cls.__name__:
                entry.failed("kv_connector", f"{kv.kv_connector} resolves to {cls.__name__}, not the pull connector")
            else:
                entry.passed("kv_connector", f"{kv.kv_connector} -> {cls.__module__}.{cls.__name__}")
        except Exception as e:
            entry.failed("kv_connector", f"KVConnectorFactory cannot resolve it: {e}")

    extra = kv.kv_connector_extra_config
    bad = []
    for key, types in REQUIRED_EXTRA.items():
        value = kv.get_from_extra_config(key, None)
        if value is None:
            bad.append(f"{key} missing")
        elif not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            bad.append(f"{key}={value!r} is {type(value).__name__}, want {'/'.join(t.__name__ for t in types)}")
    backends = extra.get("backends")
    if isinstance(backends, list) and not (backends and all(isinstance(b, str) and b for b in backends)):
        bad.append(f"backends={backends!r} must be a non-empty list of plugin names")
    lease = extra.get("kv_lease_duration")
    if isinstance(lease, int) and not isinstance(lease, bool) and lease // 6 < 1:
        bad.append(f"kv_lease_duration={lease}: vLLM heartbeats every lease // 6 = {lease // 6} s")
    if bad:
        entry.failed("extra_config", "; ".join(bad))
    else:
        entry.passed("extra_config", ", ".join(f"{k}={extra[k]!r}" for k in REQUIRED_EXTRA))

    known = _nixl_extra_keys_read_by_vllm()
    if not known:
        entry.skipped("extra_config_keys_read", "found no get_from_extra_config calls in vLLM's nixl package")
    elif unread := sorted(set(extra) - known):
        entry.failed(
            "extra_config_keys_read", f"vLLM's NixlConnector never reads {unread} (typo?); it reads {sorted(known)}"
        )
    else:
        entry.passed("extra_config_keys_read", f"every key is read by vLLM's nixl package ({sorted(known)})")

    if device is None:
        entry.skipped("kv_buffer_device", "no target device given with the entry")
        return
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils import _NIXL_SUPPORTED_DEVICE

    if device not in _NIXL_SUPPORTED_DEVICE:
        entry.skipped(
            "kv_buffer_device",
            f"device {device!r} is an out-of-tree platform; upstream vLLM's table "
            f"covers {sorted(_NIXL_SUPPORTED_DEVICE)}",
        )
    elif kv.kv_buffer_device not in _NIXL_SUPPORTED_DEVICE[device]:
        entry.failed(
            "kv_buffer_device",
            f"NIXL on {device} supports kv_buffer_device {_NIXL_SUPPORTED_DEVICE[device]}, got {kv.kv_buffer_device!r}",
        )
    else:
        entry.passed("kv_buffer_device", f"{kv.kv_buffer_device!r} is supported by NIXL on {device}")


def _engine_config(entry: Entry, args: Any, model_dir: str, records: _Records) -> Any | None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import propagate_flash_late_interaction
    from vllm.usage.usage_lib import UsageContext

    original = args.model
    args.model = args.model_tag = model_dir
    for attr in ("tokenizer", "hf_config_path"):
        if getattr(args, attr, None) == original:
            setattr(args, attr, model_dir)
    try:
        engine_args = AsyncEngineArgs.from_cli_args(args)
        propagate_flash_late_interaction(args, engine_args)
    except Exception as e:
        entry.failed("engine_args", f"AsyncEngineArgs.from_cli_args: {type(e).__name__}: {e}")
        return None
    entry.passed("engine_args", "AsyncEngineArgs.from_cli_args")
    try:
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except Exception as e:
        entry.failed("engine_config", f"create_engine_config: {type(e).__name__}: {e}")
        return None
    finally:
        records.listen()
    entry.passed("engine_config", f"create_engine_config on platform {config.device_config.device_type}")
    return config


def _check_engine_config(entry: Entry, config: Any, args: Any) -> None:
    mismatches = []
    want = {
        "parallel_config.tensor_parallel_size": args.tensor_parallel_size,
        "kv_transfer_config": args.kv_transfer_config,
    }
    if args.block_size is not None:
        want["cache_config.block_size"] = args.block_size
    if args.max_model_len is not None:
        want["model_config.max_model_len"] = args.max_model_len
    for path, expected in want.items():
        got = config
        for part in path.split("."):
            got = getattr(got, part)
        if got != expected:
            mismatches.append(f"{path}: command line says {expected!r}, VllmConfig has {got!r}")
    if mismatches:
        entry.failed("engine_config_values", "; ".join(mismatches))
    else:
        entry.passed("engine_config_values", ", ".join(want))


def _check_nixl_scheduler(entry: Entry, config: Any) -> None:
    """Builds the scheduler side of the connector, whose constructor reads the bidirectional keys."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    mc, pc = config.model_config, config.parallel_config
    hf = mc.hf_text_config
    if getattr(hf, "sliding_window", None) or (
        getattr(hf, "layer_types", None) and set(hf.layer_types) != {"full_attention"}
    ):
        entry.skipped("nixl_scheduler", "the model is not full-attention only; no synthetic KV cache layout")
        return
    # The worker would size num_blocks from profiled memory; the scheduler only needs the layout.
    spec = FullAttentionSpec(
        block_size=config.cache_config.block_size,
        num_kv_heads=mc.get_num_kv_heads(pc),
        head_size=mc.get_head_size(),
        dtype=mc.dtype,
    )
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(mc.get_num_layers(pc))]
    kv_cache_config = KVCacheConfig(
        num_blocks=1024, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(layers, spec)]
    )
    try:
        connector = KVConnectorFactory.create_connector(config, KVConnectorRole.SCHEDULER, kv_cache_config)
    except Exception as e:
        entry.failed(
            "nixl_scheduler", f"scheduler-side {config.kv_transfer_config.kv_connector}: {type(e).__name__}: {e}"
        )
        return
    try:
        sched = connector.connector_scheduler
        extra = config.kv_transfer_config.kv_connector_extra_config
        read = {
            "bidirectional_kv_xfer": sched.is_bidirectional_kv_xfer_enabled,
            "kv_recompute_threshold": sched.kv_recompute_threshold,
            "decoder_kv_blocks_ttl": sched.decoder_kv_blocks_ttl,
            "kv_lease_duration": sched._kv_lease_duration,
        }
        wrong = [f"{k}: set {extra.get(k)!r}, scheduler runs with {v!r}" for k, v in read.items() if extra.get(k) != v]
        if wrong:
            entry.failed("nixl_scheduler", "; ".join(wrong))
        else:
            entry.passed(
                "nixl_scheduler",
                f"{type(sched).__name__} runs with {read}, heartbeat every {sched._heartbeat_interval} s",
            )
    finally:
        with contextlib.suppress(Exception):
            connector.shutdown()


def check(item: dict[str, Any]) -> dict[str, Any]:
    entry = Entry(str(item.get("name", "?")))
    result: dict[str, Any] = {
        "name": entry.name,
        "ok": False,
        "model": None,
        "errors": entry.errors,
        "checks": entry.checks,
        "warnings": [],
        "kv_transfer_config": None,
        "engine_config": None,
    }
    records = _Records()
    records.listen()
    from vllm import logger as vllm_logger

    for once in ("_print_warning_once", "_print_error_once"):  # so each entry sees its own one-time warnings
        with contextlib.suppress(AttributeError):
            getattr(vllm_logger, once).cache_clear()
    started = time.monotonic()
    try:
        argv = item.get("argv")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            entry.failed("argv", "argv must be a list of strings")
            return result
        args = _parse(entry, argv)
        if args is None:
            return result
        result["model"] = args.model
        kv = args.kv_transfer_config
        if kv is not None and dataclasses.is_dataclass(kv):
            result["kv_transfer_config"] = _jsonable(dataclasses.asdict(kv))
        _check_kv_transfer(entry, kv, item.get("device"))

        shape, how = _model_shape(args.model, item.get("hf_config"))
        with tempfile.TemporaryDirectory(prefix="duplex-vllm-model-") as model_dir:
            Path(model_dir, "config.json").write_text(json.dumps(shape))
            entry.passed("model_stand_in", f"{args.model!r} -> local config.json only ({how})")
            config = _engine_config(entry, args, model_dir, records)
            if config is None:
                entry.skipped("nixl_scheduler", "needs the engine config")
                return result
            result["engine_config"] = {
                "device": config.device_config.device_type,
                "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
                "pipeline_parallel_size": config.parallel_config.pipeline_parallel_size,
                "world_size": config.parallel_config.world_size,
                "nnodes": config.parallel_config.nnodes,
                "node_rank": config.parallel_config.node_rank,
                "master_addr": config.parallel_config.master_addr,
                "distributed_executor_backend": str(config.parallel_config.distributed_executor_backend),
                "block_size": config.cache_config.block_size,
                "enable_prefix_caching": config.cache_config.enable_prefix_caching,
                "max_model_len": config.model_config.max_model_len,
                "dtype": str(config.model_config.dtype),
                "served_model_name": config.model_config.served_model_name,
            }
            _check_engine_config(entry, config, args)
            if config.kv_transfer_config is None or config.kv_transfer_config.kv_connector != EXPECTED_CONNECTOR:
                entry.skipped("nixl_scheduler", f"the connector is not {EXPECTED_CONNECTOR}")
            else:
                _check_nixl_scheduler(entry, config)
    except Exception as e:  # a bug here must show up as a failed entry, not as a crash that hides the others
        entry.failed("checker", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    finally:
        logging.getLogger("vllm").removeHandler(records)
        result["warnings"] = records.lines
        result["seconds"] = round(time.monotonic() - started, 2)
        result["ok"] = not entry.errors
    return result


def main() -> int:
    try:
        items = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        print(f"vllm_check: stdin is not JSON: {e}", file=sys.stderr)
        return 2
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        print("vllm_check: stdin must be a JSON list of {name, argv} objects", file=sys.stderr)
        return 2
    started = time.monotonic()
    # vLLM, torch and native libraries print to stdout here and there (some from C): point fd 1 at stderr while
    # checking, so the real stdout carries only our JSON.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    with contextlib.redirect_stdout(sys.stderr):
        import vllm

        imported = time.monotonic() - started
        results = [check(item) for item in items]
    print(
        f"vllm_check: vllm {vllm.__version__}, import {imported:.1f} s, {len(results)} entries in "
        f"{time.monotonic() - started:.1f} s",
        file=sys.stderr,
    )
    json.dump(results, out, indent=2)
    out.write("\n")
    out.flush()
    return 0 if results and all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
