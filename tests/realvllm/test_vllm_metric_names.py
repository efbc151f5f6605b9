"""vllm-metrics.txt against a real scrape: the session's real vLLM CPU engines behind `duplex router`, after a
two-turn conversation; every listed name is exported with the listed type and labels. Here rather than with the
other metric lists (tests/observability) so that it reads the engines this tier starts anyway."""

from __future__ import annotations

import uuid

from exporters import scrape
from promql import HERE, listed

from duplex_dev.launch.router import RouterProcess

from .conftest import Engines
from .rig import chat

VLLM = listed(HERE / "vllm-metrics.txt")


def test_real_vllm_engines_export_the_listed_names(engines: Engines, router: RouterProcess) -> None:
    conversation = f"vllm-names-{uuid.uuid4().hex[:8]}"
    messages = [{"role": "user", "content": "Summarise the quarterly report in detail, please. " * 12}]
    first = chat(router.url, messages, conversation_id=conversation, max_tokens=8)  # asserts an answer (rig.Turn)
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Now the three risks."}]
    chat(router.url, messages, conversation_id=conversation, max_tokens=8)
    exported = {
        role: scrape(engine.url + "/metrics")
        for role, engine in (("prefill", engines.prefill), ("decode", engines.decode))
    }
    for entry in {e.name: e for e in VLLM.values()}.values():
        found = [fams[s] for fams in exported.values() for s in entry.sample_names() if s in fams]
        assert found, f"{entry.name} is in vllm-metrics.txt but neither real engine exports it"
        for family in found:
            assert family.type == entry.type, (entry.name, family.type)
            if family.sampled:
                assert family.labels <= entry.labels, (entry.name, family.labels, entry.labels)
