"""Regression (fixed): offline validation (`duplex render`, render.parse_spec) accepts documents the API server refuses, so what
users preview is not what the cluster accepts.

1. snake_case field names: Checked.model_config has populate_by_name=True (operator/duplex/api/rules.py), so
   `prefill: {tensor_parallel_size: 4}` or `kv_transfer: {...}` validates and renders TP 4 / the KV settings, while
   the CRD only knows camelCase: kubectl (strict field validation) refuses `unknown field "spec.prefill.tensor_parallel_size"`
   (or, with validation off, the API server prunes it and the serving runs with TP 1).
2. lax type coercion: pydantic's default lax mode turns "2" into 2 and "true" into True; the CRD types them
   integer/boolean and admission refuses strings.
Fix (operator/duplex/render.py parse_spec):
    DisaggregatedServingSpec.model_validate(spec, strict=True, by_alias=True, by_name=False)
(checked: FULL/FULL_ALT/seed/trainium still validate; the cases below are refused), or set
validate_by_name=False / strict=True in Checked.model_config if no code constructs models by field name.
"""

import pytest
from dsv_helpers import spec_dict

from duplex.render import InvalidSpec, parse_spec


@pytest.mark.parametrize(
    "patch,path",
    [
        ({"prefill": {"tensor_parallel_size": 4}}, "spec.prefill.tensor_parallel_size"),
        ({"kv_transfer": {"decode_blocks_ttl": 900}}, "spec.kv_transfer"),
        ({"model": {"extra_args": ["--enforce-eager"]}}, "spec.model.extra_args"),
        ({"router": {"conversation": {"body_field": "x"}}}, "spec.router.conversation.body_field"),
    ],
)
def test_snake_case_field_names_are_unknown_fields(patch, path):
    with pytest.raises(InvalidSpec) as info:
        parse_spec(spec_dict(patch))
    assert any(e.startswith(path) for e in info.value.errors), info.value.errors


@pytest.mark.parametrize(
    "patch",
    [
        {"prefill": {"replicas": "2"}},
        {"kvTransfer": {"decodeBlocksTTL": "600"}},
        {"kvTransfer": {"bidirectional": "true"}},
        {"prefill": {"enablePrefixCaching": "false"}},
        {"router": {"service": {"port": "80"}}},
    ],
)
def test_strings_are_not_coerced_where_the_crd_wants_numbers_or_booleans(patch):
    with pytest.raises(InvalidSpec):
        parse_spec(spec_dict(patch))
