"""Regression (fixed): two smaller mismatches between what `duplex render` accepts and what the cluster does.

A. router.conversation {bodyField: null, header: null} (or just `header: null` to stop reading the header):
   the API server prunes nulls of non-nullable fields and then applies the schema defaults, so on the cluster both are
   restored ("conversation_id" / "X-Conversation-Id"): the CEL rule `has(self.bodyField) || has(self.header)` can
   never fail there, while render_cli refuses the document (or, for `header: null`, renders router.json with
   header null although the cluster runs with X-Conversation-Id). The rule is not enforced identically.
   Fix: decide the intended semantics. Either mark bodyField/header `nullable: true` in the CRD (json_schema_extra)
   and write the CEL as `(has(self.bodyField) && self.bodyField != null) || (has(self.header) && self.header != null)`,
   or make parse_spec drop explicit nulls before validation (as the API server does) and delete the dead rule.
B. An env entry with both value and valueFrom (spec.model.env / spec.<role>.env) is accepted by the models and the
   CRD, but the API server rejects the Deployment (`valueFrom: Invalid value: "": may not be specified when `value`
   is not empty`), so the operator fails at apply time. Fix: a Rule on EnvVar,
   cel="!has(self.value) || !has(self.valueFrom)", message="env: set value or valueFrom, not both".
"""

import pytest
from dsv_helpers import spec_dict

from duplex.render import InvalidSpec, parse_spec


def test_explicit_null_header_behaves_as_on_the_api_server():
    # API server: null pruned, default applied
    parsed = parse_spec(spec_dict({"router": {"conversation": {"header": None}}}))
    assert parsed.router.conversation.header == "X-Conversation-Id"


def test_both_null_is_accepted_as_on_the_api_server():
    parsed = parse_spec(spec_dict({"router": {"conversation": {"bodyField": None, "header": None}}}))
    assert parsed.router.conversation.body_field == "conversation_id"


@pytest.mark.parametrize("where", ["model", "prefill", "decode"])
def test_env_with_value_and_value_from_is_refused(where):
    env = [{"name": "X", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    with pytest.raises(InvalidSpec):
        parse_spec(spec_dict({where: {"env": env}}))
