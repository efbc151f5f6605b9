"""The Grafana dashboard: the panels the chart promises, Prometheus queries that promtool parses, and variables
that every panel honours."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from promql import DASHBOARD, dashboard_panels, dashboard_queries, for_promtool, metric_names
from tooling import promtool, run

# What each panel must show, by the metric it reads (brief: reuse by reason, tokens read back, TTFT, NIXL
# transfer time, store size, operator reconciles).
PROMISED = {
    "Reuse hits and misses by reason": {"duplex_router_kv_reuse_hits_total", "duplex_router_kv_reuse_misses_total"},
    "Tokens read back from decode": {"vllm:prompt_tokens_by_source_total", "duplex_router_kv_reused_tokens_total"},
    "TTFT (router) with and without reuse": {"duplex_router_time_to_first_token_seconds_bucket"},
    "NIXL transfer time": {"vllm:nixl_xfer_time_seconds_bucket"},
    "Conversation store": {"duplex_router_store_entries", "duplex_router_store_bytes"},
    "Gap between a conversation's turns": {"duplex_router_turn_gap_seconds_bucket"},
    "Reconciles by result": {"duplex_reconciles_total"},
}


def test_ttft_is_split_by_reuse() -> None:
    panel = next(p for p in dashboard_panels() if p["title"] == "TTFT (router) with and without reuse")
    ttft = [t["expr"] for t in panel["targets"] if "time_to_first_token" in t["expr"]]
    assert ttft and all("by (le, reuse)" in e for e in ttft)


def test_promised_panels_read_their_metrics() -> None:
    panels = {p["title"]: p for p in dashboard_panels()}
    for title, metrics in PROMISED.items():
        assert title in panels, title
        read = set().union(*(metric_names(t["expr"]) for t in panels[title]["targets"]))
        assert metrics <= read, (title, read)


def test_promtool_parses_every_panel_query(tmp_path: Path) -> None:
    queries = dashboard_queries()
    rules = [{"record": f"dashboard:query_{i}", "expr": for_promtool(q.expr)} for i, q in enumerate(queries)]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = run([promtool(), "check", "rules", path], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_panels_use_the_datasource_and_serving_variables() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "serving"} <= variables
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard_panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            serving_scoped = any(n.startswith(("duplex_router_", "vllm:")) for n in names)
            if serving_scoped:
                assert 'serving=~"$serving"' in target["expr"], (panel["title"], target["expr"])
