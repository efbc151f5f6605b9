"""The chart's alerts through promtool: `check rules` (syntax, PromQL, templates) and `test rules`
(prometheus-rules.test.yaml), with every alert covered by a firing and a not-firing case."""

from __future__ import annotations

from pathlib import Path

import yaml
from promql import RULES, rule_queries
from tooling import promtool, run

TESTS = Path(__file__).with_name("prometheus-rules.test.yaml")


def test_promtool_check_rules() -> None:
    out = run([promtool(), "check", "rules", RULES]).stdout
    assert f"SUCCESS: {len(rule_queries())} rules found" in out


def test_promtool_test_rules() -> None:
    proc = run([promtool(), "test", "rules", TESTS], check=False)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    alerts = {q.where.removeprefix("alert ") for q in rule_queries()}
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    assert alerts - firing == set(), "alerts never tested firing"
    assert alerts - quiet == set(), "alerts never tested staying quiet"
    assert (firing | quiet) <= alerts, "tests name alerts that do not exist"


def test_every_alert_says_how_bad_and_what_to_do() -> None:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
            assert rule["for"], f"{rule['alert']} fires on a single evaluation"
