"""The PromQL the chart ships (alert rules and dashboard panels), and the metric and label names it queries.

A small lexer, not a PromQL parser: promtool parses the expressions (test_dashboard.py, test_prometheus_rules.py);
this only needs to tell metric names from functions, keywords and label names."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from tooling import CHART

RULES = CHART / "files" / "prometheus-rules.yaml"
DASHBOARD = CHART / "files" / "grafana-dashboard.json"
HERE = Path(__file__).resolve().parent

# Labels the scrape adds (prometheus-operator's target labels and the chart's relabelings), not the exporter.
TARGET_LABELS = {"namespace", "pod", "container", "endpoint", "job", "instance", "service", "serving", "role"}
_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
}  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{([^}]*)\}")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"(?<![\w:$.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")


@dataclass(frozen=True)
class Query:
    where: str  # "alert DuplexX" or "panel Y"
    expr: str


def rule_queries() -> list[Query]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [Query(f"alert {r['alert']}", r["expr"]) for g in groups for r in g["rules"]]


def dashboard_panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def dashboard_queries() -> list[Query]:
    return [Query(f"panel {p['title']}", t["expr"]) for p in dashboard_panels() for t in p["targets"]]


def all_queries() -> list[Query]:
    return rule_queries() + dashboard_queries()


def metric_names(expr: str) -> set[str]:
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("{}", text)
    text = _GROUPING.sub(" ", text)
    text = _RANGE.sub("", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name in _KEYWORDS or name.startswith("__"):
            continue
        names.add(name)
    return names


def label_names(expr: str) -> set[str]:
    text = _STRING.sub('""', expr)
    labels = set()
    for matchers in _MATCHERS.findall(text):
        labels |= {m.group(1) for m in re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)", matchers)}
    for _, grouping in _GROUPING.findall(text):
        labels |= {name.strip() for name in grouping.split(",") if name.strip()}
    return labels - {"le"}


def for_promtool(expr: str) -> str:
    """A dashboard expression with Grafana's variables replaced, so that promtool can parse it."""
    return expr.replace("$__rate_interval", "5m").replace("$namespace", ".*").replace("$serving", ".*")


@dataclass(frozen=True)
class Listed:
    name: str
    type: str
    labels: frozenset[str]

    def sample_names(self) -> set[str]:
        return exposed_names(self.name, self.type)


def exposed_names(family: str, kind: str) -> set[str]:
    """The sample names a metric family of this type shows in the text exposition format."""
    if kind == "counter":
        return {f"{family}_total", f"{family}_created"}
    if kind == "histogram":
        return {f"{family}_bucket", f"{family}_sum", f"{family}_count", f"{family}_created"}
    return {family}


def listed(path: Path) -> dict[str, Listed]:
    """A metric list file (vllm-metrics.txt, kube-state-metrics.txt): sample name -> its listed family."""
    out: dict[str, Listed] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, kind, *labels = line.split()
        entry = Listed(name, kind, frozenset(labels))
        for sample in entry.sample_names():
            out[sample] = entry
    return out
