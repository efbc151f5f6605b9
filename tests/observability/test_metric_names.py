"""Every metric name (and label) the chart's alerts and dashboard query is one a component really exports: the
router and simulator from real scrapes of `duplex router` in front of a `duplex sim` pair, vLLM's own names from
vllm-metrics.txt checked against vLLM's source, kube-state-metrics' from its list. The operator's names are checked
against a scrape of `duplex operator` in tests/integration/test_chart_monitoring.py."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from exporters import Family, scrape, vllm_source_declarations
from promql import HERE, TARGET_LABELS, all_queries, label_names, listed, metric_names

from duplex_dev.chat import ChatClient, Conversation
from duplex_dev.launch.router import RouterProcess
from duplex_dev.launch.sim import sim_pair

pytestmark = pytest.mark.nixl  # the simulator moves KV blocks with the real nixl package

VLLM = listed(HERE / "vllm-metrics.txt")
KUBE_STATE = listed(HERE / "kube-state-metrics.txt")
OPERATOR_PREFIXES = ("duplex_reconcile", "duplex_api_", "duplex_managed_", "duplex_servings")


def queried() -> dict[str, set[str]]:
    """metric name -> where it is queried."""
    out: dict[str, set[str]] = {}
    for query in all_queries():
        for name in metric_names(query.expr):
            out.setdefault(name, set()).add(query.where)
    return out


@pytest.fixture(scope="module")
def scrapes() -> Iterator[dict[str, dict[str, Family]]]:
    """A router in front of a simulated prefill/decode pair after a two-turn conversation (so that reuse, captures,
    TTFT, legs and the store all have samples), scraped once each."""
    with sim_pair(prefill_args=("--no-enable-prefix-caching",)) as (prefill, decode):
        router = RouterProcess(prefill=[prefill.url], decode=[decode.url])
        with router:

            async def converse() -> None:
                async with ChatClient(router.url) as client:
                    conv = Conversation(f"names-{uuid.uuid4().hex[:8]}")
                    await client.turn(conv, "Summarise the quarterly report in detail, please. " * 12, max_tokens=16)
                    await client.turn(conv, "Now list the three main risks.", max_tokens=16)

            asyncio.run(converse())
            assert router.metric("duplex_router_kv_reuse_hits_total") >= 1, router.log_tail()
            yield {
                "router": scrape(router.url + "/metrics"),
                "prefill": scrape(prefill.url + "/metrics"),
                "decode": scrape(decode.url + "/metrics"),
            }


def test_every_queried_name_has_a_known_exporter() -> None:
    for name, where in queried().items():
        known = (
            name.startswith("duplex_router_")
            or name.startswith(OPERATOR_PREFIXES)
            or name in VLLM
            or name in KUBE_STATE
        )
        assert known, f"{name} (queried in {sorted(where)}) is exported by nothing duplex runs or lists"


def test_the_router_exports_every_router_name_queried(scrapes) -> None:
    router = scrapes["router"]
    missing = {n: w for n, w in queried().items() if n.startswith("duplex_router_") and n not in router}
    assert not missing, f"queried but not exported by `duplex router`: {missing}"


def test_labels_queried_are_labels_exported(scrapes) -> None:
    """A label a query selects or groups by (other than the scrape's own target labels) belongs to one of the
    metrics it reads."""
    known: dict[str, Family] = {**scrapes["router"]}
    for sample, entry in {**VLLM, **KUBE_STATE}.items():
        known.setdefault(sample, Family(entry.name, entry.type, set(entry.labels), sampled=True))
    for query in all_queries():
        names = {n for n in metric_names(query.expr) if not n.startswith(OPERATOR_PREFIXES)}
        if not names:
            continue
        families = [known[n] for n in names if n in known]
        assert len(families) == len(names), (query.where, names - set(known))
        if not all(f.sampled for f in families):
            continue
        offered = set().union(*(f.labels for f in families))
        extra = label_names(query.expr) - TARGET_LABELS - offered
        assert not extra, f"{query.where}: {sorted(extra)} are not labels of {sorted(names)}: {query.expr}"


def test_vllm_names_queried_are_vllm_names() -> None:
    declared = vllm_source_declarations()
    for entry in VLLM.values():
        assert declared.get(entry.name) == entry.type, (
            f"vllm-metrics.txt lists {entry.name} as a {entry.type}; vLLM's source declares {declared.get(entry.name)}"
        )
    for name in queried():
        if name.startswith("vllm:"):
            assert name in VLLM, f"{name} is not in vllm-metrics.txt"


def test_the_simulator_exports_vllm_names_with_vllms_types(scrapes) -> None:
    """Where the simulator imitates a vLLM metric, it uses vLLM's name, type and labels."""
    declared = vllm_source_declarations()
    for role in ("prefill", "decode"):
        families = {f.name: f for f in scrapes[role].values() if f.name.startswith("vllm:")}
        assert families, role
        for name, family in families.items():
            assert declared.get(name) == family.type, (role, name, family.type, declared.get(name))
            entry = next((e for e in VLLM.values() if e.name == name), None)
            if entry is not None and family.sampled:
                assert family.labels <= entry.labels, (role, name, family.labels, entry.labels)


def test_the_metric_lists_cite_their_source() -> None:
    for path in (HERE / "vllm-metrics.txt", HERE / "kube-state-metrics.txt"):
        header = "\n".join(line for line in Path(path).read_text().splitlines() if line.startswith("#"))
        assert "Source:" in header, path
