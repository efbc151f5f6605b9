"""Tables two py-spy raw profiles of the router (bench/profile_router.sh): where each one's CPU went, per source file
and per layer, in milliseconds per 1k requests, so that routers that served different numbers of requests compare.

    python bench/profile_files.py NOW.txt OLD.txt BENCH.json OLD_COMMIT   # markdown on stdout

Samples are py-spy's (100 Hz, non-idle threads); a sample is attributed to the file of its innermost Python frame,
so time in C (the event loop, socket writes) lands on the Python line that called it.
"""

from __future__ import annotations

import collections
import json
import re
import sys

SAMPLE_MS = 10.0  # py-spy --rate 100
LAYERS = (  # first match wins
    ("HTTP/1.1 server and engine client", r"^(http1/|router/(front|engine_client)\.py)"),
    ("request path", r"^(router/|protocol\.py)"),
    ("event loop (asyncio, uvloop; C time included)", r"^asyncio/|uvloop"),
    ("metrics", r"prometheus_client/"),
    ("other", r""),
)


def self_samples(path: str) -> collections.Counter[str]:
    """Samples per file of the innermost frame."""
    out: collections.Counter[str] = collections.Counter()
    with open(path) as f:
        lines = f.read().splitlines()
    for line in lines:
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        m = re.search(r"\((.*?):\d+\)$", stack.split(";")[-1])
        name = m.group(1) if m else "?"
        out[re.sub(r".*(site-packages|duplex_sidecars)/", "", re.sub(r".*/lib/python3\.\d+/", "", name))] += int(n)
    return out


def layer(name: str) -> str:
    return next(label for label, pattern in LAYERS if re.search(pattern, name))


def requests(bench: dict, contender: str) -> float:
    """Requests a router served over the whole run (the cells' windows, scaled up for their warm-ups)."""
    settings = bench["load"]["settings"]
    scale = (settings["duration_s"] + settings["warmup_s"]) / settings["duration_s"]
    return scale * sum(c["requests"] for c in bench["load"]["cells"] if c["contender"] == contender)


def main(now_path: str, old_path: str, bench_path: str, old_commit: str) -> None:
    with open(bench_path) as f:
        bench = json.load(f)
    now, old = self_samples(now_path), self_samples(old_path)
    rn, ro = requests(bench, "duplex"), requests(bench, f"duplex@{old_commit}")

    def ms(samples: float, reqs: float) -> float:
        return samples * SAMPLE_MS / reqs * 1000

    print(f"CPU in ms per 1k requests (py-spy, {rn:.0f} and {ro:.0f} requests served); now vs {old_commit}\n")
    print(f"| layer | now | {old_commit} | difference |\n|---|---:|---:|---:|")
    layers_now, layers_old = collections.Counter(), collections.Counter()
    for name, n in now.items():
        layers_now[layer(name)] += n
    for name, n in old.items():
        layers_old[layer(name)] += n
    for label, _ in LAYERS:
        a, b = ms(layers_now[label], rn), ms(layers_old[label], ro)
        print(f"| {label} | {a:.0f} | {b:.0f} | {a - b:+.0f} |")
    a, b = ms(sum(now.values()), rn), ms(sum(old.values()), ro)
    print(f"| **all** | **{a:.0f}** | **{b:.0f}** | **{a - b:+.0f}** |\n")
    print(f"| file | now | {old_commit} |\n|---|---:|---:|")
    for name in sorted(set(now) | set(old), key=lambda k: -(ms(now[k], rn) + ms(old[k], ro)))[:20]:
        print(f"| `{name}` | {ms(now[name], rn):.0f} | {ms(old[name], ro):.0f} |")


if __name__ == "__main__":
    main(*sys.argv[1:5])
