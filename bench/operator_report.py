"""The operator benchmark's analysis (growth from the smallest to the largest size, the targets) and its markdown."""

from __future__ import annotations

import json
import math
from typing import Any

import operator_stats as stats

# (label, how to read the figure from a row): the metrics whose growth with the number of servings is reported.
METRICS: tuple[tuple[str, Any], ...] = (
    ("time until all Ready (s)", lambda r: r["all_ready_s"]),
    ("apply-to-children p50 (s)", lambda r: r["children_s"]["p50"]),
    ("apply-to-children p99 (s)", lambda r: r["children_s"]["p99"]),
    ("apply-to-children one at a time p99 (s)", lambda r: r["single_children_s"]["p99"]),
    ("requests to converge", lambda r: r["converge_requests"]["requests"]),
    ("idle requests per resync period", lambda r: r["idle"]["requests_per_resync"]),
    ("idle writes", lambda r: r["idle"]["writes"]),
    ("CPU seconds to converge", lambda r: r["converge_cpu_s"]),
    ("idle CPU (% of a core)", lambda r: r["idle_cpu_pct"]),
    ("RSS peak (MiB)", lambda r: r["rss_mib"]["peak"]),
)

CONVERGE_HEADER = [
    "servings", "create calls (s)", "all Ready (s)", "children p50 / p99 / max (s)", "one at a time p50 / p99 (s)",
    "Ready p50 / p99 (s)",
    "requests to converge (per serving)", "writes to converge",
]  # fmt: skip
IDLE_HEADER = [
    "servings", "idle window (s)", "passes (expected)", "requests (resumed watches)", "requests per resync period",
    "writes", "CPU to converge (s)", "idle CPU (% core)", "RSS converged / idle end / peak (MiB)",
]  # fmt: skip


def _value(read: Any, row: dict[str, Any]) -> float:
    value = read(row)
    return math.nan if value is None else float(value)


def analyse(results: dict[str, Any]) -> None:
    rows = results["rows"]
    sizes = [r["servings"] for r in rows]
    results["growth"] = [
        {
            "metric": label,
            "values": [_value(read, r) for r in rows],
            **stats.growth(sizes, [_value(read, r) for r in rows]),
        }
        for label, read in METRICS
    ]
    results["verdicts"] = stats.verdicts(rows[-1])


def _f(x: Any, spec: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _burst_cpu(rows: list[dict[str, Any]], cpus: int) -> list[str]:
    measured = [r for r in rows if "burst_cpu" in r]
    if not measured:
        return ["(not measured in this run)"]
    names = sorted({k for r in measured for k in r["burst_cpu"] if k != "wall_s"})
    body = []
    for r in measured:
        cpu = r["burst_cpu"]
        used = sum(cpu.get(k, 0.0) for k in names)
        share = used / (cpu["wall_s"] * cpus)
        body.append([str(r["servings"]), _f(cpu["wall_s"], ".1f"), *(_f(cpu.get(k), ".1f") for k in names),
                     f"{_f(used, '.0f')} ({share:.0%})"])  # fmt: skip
    return _table(["servings", "wall s", *names, "sum (of the cores)"], body)


def markdown(results: dict[str, Any]) -> str:
    m, rows = results["machine"], results["rows"]
    quick = "--quick" in results["command"]
    out = [
        f"# Operator benchmark{' (quick run: small sizes, short idle window)' if quick else ''}",
        "",
        f"Command: `{results['command']}`  ",
        f"Commit {m['git_commit']}; {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_gib']} GiB, "
        f"Linux {m['kernel']}, Python {m['python']}; load average {_f(results['load_before'][0])} before, "
        f"{_f(results['load_after'][0])} after; {results['wall_s'] / 60:.1f} min in all.",
        "",
        f"The real local control plane (duplex_dev.cluster) with {results['nodes']['p5en.48xlarge']} fake p5en.48xlarge "
        f"and {results['nodes']['m7i.4xlarge']} m7i.4xlarge kwok nodes; one fresh `duplex operator --all-namespaces` "
        "per size, under the chart's ClusterRole, "
        f"{results.get('workers') or 'the default'} reconcile workers, resync every "
        f"{results['resync_seconds']:.0f} s; the servings (the seed at TP 1, bench/operator_fleet.py) created by "
        f"{results['clients']} client threads into one namespace per size; an idle window of "
        f"{results['idle_seconds']:.0f} s once all are Ready and the operator has not written for 5 s."
        + ("" if results["complete"] else " **The run did not complete: the rows below are what it measured.**"),
        "",
        "## Targets (at the largest size)",
        "",
        *_table(
            ["target", "measured", "met"],
            [[v["target"], v["measured"], "yes" if v["met"] else "**no**"] for v in results["verdicts"]],
        ),
        "",
        "## Per size",
        "",
        "Apply-to-children: from a serving's create call returning to its three Deployments (prefill, decode, router) "
        "all seen on a watch, for the N created at once (a burst: the later ones wait in the operator's queue) and for "
        f"{results.get('probes', 0)} more created one at a time after the idle window, beside the N. Ready: its Ready condition True at its current generation (kwok runs the pods). "
        "Requests are the operator identity's, from the API server's audit log.",
        "",
        *_table(
            CONVERGE_HEADER,
            [
                [
                    str(r["servings"]),
                    _f(r["create_s"], ".1f"),
                    _f(r["all_ready_s"], ".1f") if r["all_ready_s"] is not None else f"{r['ready']} Ready",
                    " / ".join(_f(r["children_s"][k]) for k in ("p50", "p99", "max")),
                    " / ".join(_f(r["single_children_s"][k]) for k in ("p50", "p99")),
                    " / ".join(_f(r["ready_s"][k], ".1f") for k in ("p50", "p99")),
                    f"{r['converge_requests']['requests']} ({_f(r['converge_requests']['per_serving'], '.1f')})",
                    str(r["converge_requests"]["writes"]),
                ]
                for r in rows
            ],
        ),
        "",
        *_table(
            IDLE_HEADER,
            [
                [
                    str(r["servings"]),
                    _f(r["idle"]["window_s"], ".0f"),
                    f"{r['idle']['passes']:.0f} ({r['idle']['passes_expected']:.0f})",
                    f"{r['idle']['requests']} ({r['idle']['resumed_watches']})",
                    _f(r["idle"]["requests_per_resync"]),
                    str(r["idle"]["writes"]),
                    _f(r["converge_cpu_s"], ".1f"),
                    _f(r["idle_cpu_pct"], ".1f"),
                    " / ".join(_f(r["rss_mib"][k], ".0f") for k in ("converged", "idle_end", "peak")),
                ]
                for r in rows
            ],
        ),
        "",
        "## Where the burst's CPU went",
        "",
        f"CPU seconds of each process from the first create to the last Ready, against the wall time x "
        f"{m['nproc']} CPUs: when the sum nears that, the burst is bound by the machine, not by the operator.",
        "",
        *_burst_cpu(rows, int(m["nproc"])),
        "",
        "## Growth from the smallest to the largest size",
        "",
        "The exponent k in value ~ servings^k between the two ends (1: linear, 0: flat; - where a value is 0).",
        "",
        *_table(
            ["metric", *(str(r["servings"]) for r in rows), "ratio", "k"],
            [
                [g["metric"], *(_f(v) for v in g["values"]), _f(g["ratio"]), _f(g["exponent"])]
                for g in results["growth"]
            ],
        ),
        "",
        "## Idle requests by verb and resource (largest size)",
        "",
        "```",
        json.dumps(rows[-1]["idle"]["by_verb_resource"], indent=1),
        "```",
        "",
    ]
    return "\n".join(out)
