"""Regression (fixed): kvTransfer.sideChannelPort may equal the engines' HTTP port 8000 (the CRD allows 1024-65535).

Then each engine Service gets two ports {8000/TCP} (http and nixl-side) and the API server rejects it
(core validation: spec.ports[1]: Duplicate value: {port 8000, TCP}); the engine container also declares 8000 twice
and vLLM's HTTP server and the NIXL side channel would fight over the port. The spec is accepted by `duplex render`
and by admission, and the operator fails at apply time.
Fix: reject it in the API, e.g. on KVTransferSpec a Rule
  cel="self.sideChannelPort != 8000", message="kvTransfer.sideChannelPort must differ from the engines' HTTP port 8000"
"""

import pytest
from dsv_helpers import children, spec_dict

from duplex.render import InvalidSpec, parse_spec


def test_side_channel_port_equal_to_http_port_is_refused():
    with pytest.raises(InvalidSpec):
        parse_spec(spec_dict({"kvTransfer": {"sideChannelPort": 8000}}))


def test_rendered_service_ports_are_unique_for_every_accepted_side_channel_port():
    try:
        objs = children({"kvTransfer": {"sideChannelPort": 8000}})
    except InvalidSpec:
        return
    for svc in (o for o in objs if o["kind"] == "Service"):
        keys = [(p["port"], p["protocol"]) for p in svc["spec"]["ports"]]
        assert len(keys) == len(set(keys)), svc["metadata"]["name"]
