"""What the components really export: one scrape parsed into metric families (type, sample names, label names),
and what vLLM's own source declares (the cached vLLM package that hack/setup-vllm.sh installs)."""

from __future__ import annotations

import os
import re
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from promql import exposed_names
from tooling import CACHE

from duplex_dev.versions import version

VLLM_VENV = CACHE / f"vllm-{version('VLLM_VERSION')}"
_DECLARED = re.compile(r"_(counter|gauge|histogram)_cls\(\s*name=\"(vllm:[a-z0-9_]+)\"")


@dataclass
class Family:
    name: str
    type: str
    labels: set[str] = field(default_factory=set)
    sampled: bool = False  # labels are known only once the family has samples

    def sample_names(self) -> set[str]:
        return exposed_names(self.name, self.type)


def scrape(url: str, timeout: float = 30.0) -> dict[str, Family]:
    """sample name -> family, for every family the endpoint exposes (labelled families with no samples too)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # a busy CPU engine can take seconds
        text = resp.read().decode()
    out: dict[str, Family] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.endswith("_created"):
            continue  # prometheus_client's creation timestamps, which the text parser reads as families of their own
        family = Family(fam.name, fam.type)
        for sample in fam.samples:
            family.sampled = True
            family.labels |= set(sample.labels) - {"le", "quantile"}
        for name in family.sample_names():
            out[name] = family
    return out


def vllm_source_declarations() -> dict[str, str]:
    """vLLM metric family -> type, as vLLM's own source declares them (PrometheusStatLogger and the connectors)."""
    packages = sorted(VLLM_VENV.glob("lib/python3*/site-packages/vllm"))
    if not packages:
        ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
        pytest.fail(
            f"{'CI: ' if ci else ''}the cached vLLM package is missing ({VLLM_VENV}): run bash hack/setup-vllm.sh "
            "(hack/setup.sh runs it)",
            pytrace=False,
        )
    declared: dict[str, str] = {}
    for path in Path(packages[0]).rglob("*.py"):
        for kind, name in _DECLARED.findall(path.read_text(errors="replace")):
            declared[name] = kind
    return declared
