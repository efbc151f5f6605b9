"""The autoscaling benchmark's numbers (bench/autoscale_bench.py): per contender, 10 s bins of TTFT p90, requests,
failures and replicas; SLO attainment, the time to meet the SLO again after the step up, scale events and their
reversals, the time back down, requests failed around a scale-in; the markdown and the plot."""

from __future__ import annotations

import itertools
import math
from typing import Any

BIN_SECONDS = 10
SCALE_IN_WINDOW_S = 30  # a failure this long after a scale-in counts against it
# Targets, as stated in docs/benchmarks.md.
RECOVERY_TARGET_S = 90  # the router's 60 s window, a 15 s report and a pod start
EVENTS_TARGET = 4  # per role for one step up and down
ROLES = ("prefill", "decode")


def p90(values: list[float]) -> float | None:
    """Nearest rank: the smallest value with at least 90% of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def bins(run: dict[str, Any], end: float) -> list[dict[str, Any]]:
    """Turns by the bin they started in; replicas as the last sample of the bin has them."""
    out = []
    for k in range(math.ceil(end / BIN_SECONDS)):
        lo, hi = k * BIN_SECONDS, (k + 1) * BIN_SECONDS
        turns = [t for t in run["turns"] if lo <= t["started"] < hi]
        ttfts = [t["ttft"] for t in turns if t["ok"] and t["ttft"] is not None]
        samples = [s for s in run["samples"] if s["t"] < hi]
        last = samples[-1] if samples else {}
        row: dict[str, Any] = {
            "t": lo,
            "requests": len(turns),
            "failed": sum(1 for t in turns if not t["ok"]),
            "ttft_p90": p90(ttfts),
            "conversations": last.get("conversations"),
        }
        for role in ROLES:
            row[role] = last.get(role)
            row[f"{role}_ready"] = last.get(f"{role}_ready")
        out.append(row)
    return out


def scale_events(samples: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    """Every change of the role's Deployment replicas the poller saw: (t, from, to)."""
    events, before = [], None
    for s in samples:
        now = s.get(role)
        if now is None:
            continue
        if before is not None and now != before:
            events.append({"t": s["t"], "from": before, "to": now})
        before = now
    return events


def reversals(events: list[dict[str, Any]]) -> int:
    """Direction changes after the first: up, down is one; up, down, up is two."""
    signs = [1 if e["to"] > e["from"] else -1 for e in events]
    return sum(1 for a, b in itertools.pairwise(signs) if a != b)


def recovery(rows: list[dict[str, Any]], profile: dict[str, Any], slo: float) -> dict[str, Any]:
    """Seconds from the step up to the start of the first bin from which every bin of the hold meets the SLO (0: it
    never missed it); None when the hold ends missing it. Also the first bin that met it again."""
    hold = [r for r in rows if profile["step_up"] <= r["t"] < profile["step_down"]]
    missed = [r for r in hold if r["ttft_p90"] is not None and r["ttft_p90"] > slo]
    if not missed:
        return {"missed": False, "recovered_s": 0.0, "first_met_s": 0.0}
    after_last_miss = [r for r in hold if r["t"] > missed[-1]["t"]]
    first_met = next((r for r in hold if r["t"] > missed[0]["t"] and (r["ttft_p90"] or 0) <= slo), None)
    return {
        "missed": True,
        "recovered_s": after_last_miss[0]["t"] - profile["step_up"] if after_last_miss else None,
        "first_met_s": first_met["t"] - profile["step_up"] if first_met else None,
    }


def analyse(results: dict[str, Any]) -> None:
    """Adds `bins` and `summary` to every contender's run."""
    profile, slo = results["profile"], results["settings"]["slo_s"]
    for run in results["contenders"].values():
        end = max([profile["end"], *(t["ended"] for t in run["turns"])])
        run["bins"] = bins(run, end)
        turns = run["turns"]
        met = sum(1 for t in turns if t["ok"] and t["ttft"] is not None and t["ttft"] <= slo)
        hold = [t for t in turns if profile["step_up"] <= t["started"] < profile["step_down"]]
        hold_met = sum(1 for t in hold if t["ok"] and t["ttft"] is not None and t["ttft"] <= slo)
        events = {role: scale_events(run["samples"], role) for role in ROLES}
        scale_ins = [e["t"] for role in ROLES for e in events[role] if e["to"] < e["from"]]
        near_scale_in = [
            t for t in turns if not t["ok"] and any(s <= t["ended"] <= s + SCALE_IN_WINDOW_S for s in scale_ins)
        ]
        back = [s["t"] for s in run["samples"] if s["t"] >= profile["step_down"] and all(s.get(r) == 1 for r in ROLES)]
        run["summary"] = {
            "turns": len(turns),
            "failed": sum(1 for t in turns if not t["ok"]),
            "errors": sorted({t["error"] for t in turns if not t["ok"]})[:5],
            "attainment": met / len(turns) if turns else None,
            "attainment_hold": hold_met / len(hold) if hold else None,
            "ttft_p90_s": p90([t["ttft"] for t in turns if t["ok"] and t["ttft"] is not None]),
            "ttft_p90_hold_s": p90([t["ttft"] for t in hold if t["ok"] and t["ttft"] is not None]),
            "recovery": recovery(run["bins"], profile, slo),
            "events": events,
            "reversals": {role: reversals(events[role]) for role in ROLES},
            "peak": {role: max((s.get(role) or 0 for s in run["samples"]), default=None) for role in ROLES},
            "failed_near_scale_in": len(near_scale_in),
            "back_down_s": round(back[0] - profile["step_down"], 1) if back else None,
        }


# -- markdown --------------------------------------------------------------------------------------------------------


def _f(value: Any, fmt: str = "{:.2f}", none: str = "-") -> str:
    return none if value is None else fmt.format(value)


def _events(events: list[dict[str, Any]]) -> str:
    return ", ".join(f"{e['from']}→{e['to']} at {e['t']:.0f} s" for e in events) or "none"


def summary_table(results: dict[str, Any]) -> list[str]:
    slo = results["settings"]["slo_s"]
    lines = [
        f"| contender | turns | failed | SLO attainment (TTFT ≤ {slo:g} s) | during the hold | TTFT p90 in the hold | "
        "SLO met again after the step | scale events prefill / decode | reversals | peak P / D | back at 1/1 after "
        "the fall | failed near a scale-in |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, run in results["contenders"].items():
        s = run["summary"]
        rec = s["recovery"]
        if not rec["missed"]:
            recovered = "never missed"
        elif rec["recovered_s"] is None:
            recovered = "not in the hold"
        else:
            recovered = f"{rec['recovered_s']:.0f} s"
        ev = s["events"]
        scaled = any((s["peak"][r] or 0) > 1 for r in ROLES)
        back = _f(s["back_down_s"], "{:.0f} s", "not in the run") if scaled else "-"
        lines.append(
            f"| {name} | {s['turns']} | {s['failed']} | {_f(s['attainment'], '{:.1%}')} | "
            f"{_f(s['attainment_hold'], '{:.1%}')} | {_f(s['ttft_p90_hold_s'], '{:.2f} s')} | {recovered} | "
            f"{len(ev['prefill'])} / {len(ev['decode'])} | {s['reversals']['prefill']} / {s['reversals']['decode']} | "
            f"{s['peak']['prefill']} / {s['peak']['decode']} | {back} | {s['failed_near_scale_in']} |"
        )
    return lines


def bins_table(name: str, run: dict[str, Any]) -> list[str]:
    lines = [
        f"**{name}**",
        "",
        "| t (s) | conversations | requests | failed | TTFT p90 (s) | prefill (ready) | decode (ready) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in run["bins"]:
        lines.append(
            f"| {r['t']} | {_f(r['conversations'], '{}')} | {r['requests']} | {r['failed']} | {_f(r['ttft_p90'])} | "
            f"{_f(r['prefill'], '{}')} ({_f(r['prefill_ready'], '{}')}) | "
            f"{_f(r['decode'], '{}')} ({_f(r['decode_ready'], '{}')}) |"
        )
    return lines + [""]


def markdown(results: dict[str, Any], plot_name: str) -> str:
    st, prof, m = results["settings"], results["profile"], results["machine"]
    lines = [
        f"# Autoscaling benchmark, {results['date']}",
        "",
        f"`{results['command']}`, duplex {m['git_commit']}, started {results['started']}, finished "
        f"{results['finished']} (UTC); nproc {m['nproc']}, {m['cpu_model']}, {m['mem_total_gib']} GiB, kernel "
        f"{m['kernel']}; load average {results['load_average'][0]} at start, {results['load_average'][1]} at end.",
        "",
        f"Load: agentic conversations streamed through the router's Service ({st['turns_per_conversation']} turns, "
        f"{st['reply_tokens']}-token replies, think time 0.5-1.5 s): {prof['base']} at once, {prof['peak']} from "
        f"{prof['step_up']:g} s to {prof['step_down']:g} s, {prof['base']} again until {prof['end']:g} s (then, for "
        f"the autoscaled contenders, until both roles are back at 1 pod, {prof['tail_max']:g} s at most). Engines: "
        f"the simulator with `{st['sim_args']}`, maxNumSeqs prefill {st['slots']['prefill']} / decode "
        f"{st['slots']['decode']}. TTFT: the client's time to the first content token. SLO: TTFT ≤ {st['slo_s']:g} s "
        f"(p90). Autoscaled roles: 1 to {st['max_replicas']} pods; scale-down after {st['scale_down_s']} s "
        f"(planner `scaleDownSeconds`, HPA `behavior.scaleDown.stabilizationWindowSeconds`); the HPA targets "
        f"{st['hpa_cpu_utilization']}% CPU utilisation of the engine container's request.",
        "",
        *summary_table(results),
        "",
        f"Targets: the SLO met again within {RECOVERY_TARGET_S} s of the step up, at most {EVENTS_TARGET} scale "
        "events per role and one reversal (up, then down), no request failed near a scale-in (within "
        f"{SCALE_IN_WINDOW_S} s after it).",
        "",
    ]
    for name, reason in results["skipped"].items():
        lines += [f"**{name} not run**: {reason}", ""]
    for name, run in results["contenders"].items():
        ev = run["summary"]["events"]
        lines.append(f"- {name}: prefill {_events(ev['prefill'])}; decode {_events(ev['decode'])}")
    lines += ["", f"![TTFT p90 and replicas over time]({plot_name})", "", "## Scaling Events", ""]
    for name, run in results["contenders"].items():
        lines += [f"**{name}**", ""]
        for e in run.get("events") or []:
            count = f" (x{e['count']})" if e["count"] and e["count"] > 1 else ""
            lines.append(f"- {_f(e['t'], '{:.0f} s')}: {e['reason']}{count}: {e['message']}")
        lines.append("")
    lines += ["## Per 10 s bin", ""]
    for name, run in results["contenders"].items():
        lines += bins_table(name, run)
    return "\n".join(lines)


# -- plot ------------------------------------------------------------------------------------------------------------


def can_plot() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot(results: dict[str, Any], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["contenders"])
    prof, slo = results["profile"], results["settings"]["slo_s"]
    fig, axes = plt.subplots(2, len(names), figsize=(5 * len(names), 6), squeeze=False, sharex=True)
    top = max([2 * slo, *(r["ttft_p90"] or 0 for run in results["contenders"].values() for r in run["bins"])])
    for col, name in enumerate(names):
        run = results["contenders"][name]
        ttft_ax, rep_ax = axes[0][col], axes[1][col]
        xs = [r["t"] + BIN_SECONDS / 2 for r in run["bins"]]
        ttft_ax.plot(xs, [r["ttft_p90"] for r in run["bins"]], marker="o", ms=3, color="tab:blue", label="TTFT p90")
        ttft_ax.axhline(slo, color="tab:red", ls="--", lw=1, label=f"SLO {slo:g} s")
        ttft_ax.set_ylim(0, top * 1.05)
        ttft_ax.set_title(name)
        times = [s["t"] for s in run["samples"]]
        for role, colour in (("prefill", "tab:orange"), ("decode", "tab:green")):
            rep_ax.step(times, [s.get(role) for s in run["samples"]], where="post", color=colour, label=role)
            rep_ax.step(
                times, [s.get(f"{role}_ready") for s in run["samples"]], where="post", color=colour, ls=":", lw=1
            )
        rep_ax.set_ylim(0, results["settings"]["max_replicas"] + 0.5)
        rep_ax.set_xlabel("s since the start (dotted: ready pods)")
        conv = rep_ax.twinx()
        conv.step(times, [s["conversations"] for s in run["samples"]], where="post", color="grey", lw=1, alpha=0.6)
        conv.set_ylim(0, prof["peak"] * 1.1)
        if col == len(names) - 1:
            conv.set_ylabel("conversations (grey)")
        for ax in (ttft_ax, rep_ax):
            ax.axvspan(prof["step_up"], prof["step_down"], color="grey", alpha=0.08)
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("TTFT p90 per 10 s, s")
    axes[1][0].set_ylabel("replicas")
    axes[0][0].legend(loc="upper left", fontsize=8)
    axes[1][0].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"autoscaling on the local real node, simulated engines ({results['date']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
