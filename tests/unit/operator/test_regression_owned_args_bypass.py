"""Regression (fixed): owned vLLM flags can be smuggled through extraArgs in spellings vLLM's FlexibleArgumentParser accepts.

vLLM 0.33 (checked with the cached venv, vllm.utils.argparse_utils.FlexibleArgumentParser + make_arg_parser):
  --tensor_parallel_size=4                  -> tensor_parallel_size 4 (underscores normalised to dashes)
  --kv-transfer-config.kv_role=kv_producer  -> replaces the whole KVTransferConfig (kv_connector None!)
  --kv_transfer_config '{...}'              -> replaces the KVTransferConfig
  --tensor-parallel=4                       -> tensor_parallel_size 4 (argparse allow_abbrev is True)
  --max_model_len 100 / --gpu_memory_utilization=0.5 / --port=9000 -> all applied, last one wins
duplex's uses_flag() only matches `flag` and `flag=`, so all of these pass validation and override the typed fields
(TP no longer matches the accelerator count; bidirectional KV config silently replaced).
"""

import pytest
from dsv_helpers import spec_dict

from duplex.render import InvalidSpec, parse_spec

BYPASSES = [
    ["--tensor_parallel_size=4"],
    ["--tensor_parallel_size", "4"],
    ["--kv_transfer_config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'],
    ["--kv-transfer-config.kv_role=kv_producer"],
    ["--kv-transfer-config.kv_connector_extra_config.bidirectional_kv_xfer=false"],
    ["--max_model_len", "100"],
    ["--gpu_memory_utilization=0.5"],
    ["--served_model_name", "other"],
    ["--tensor-parallel=4"],  # argparse prefix abbreviation
    ["--kv-transfer", "{}"],  # argparse prefix abbreviation
]


@pytest.mark.parametrize("location", ["model", "prefill", "decode"])
@pytest.mark.parametrize("args", BYPASSES, ids=[" ".join(a)[:40] for a in BYPASSES])
def test_owned_flag_in_another_spelling_is_rejected(location, args):
    with pytest.raises(InvalidSpec) as info:
        parse_spec(spec_dict({location: {"extraArgs": args}}))
    assert all(e.startswith(f"spec.{location}.extraArgs: ") for e in info.value.errors)
