"""Where benchmark results go: the latest run of each benchmark at the top of bench/results/, every earlier one under
bench/results/history/ (moved there, never overwritten, when a new run of the same benchmark is written)."""

from __future__ import annotations

import glob
import json
import os
import shutil
from typing import Any

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
HISTORY = os.path.join(RESULTS, "history")


def retire(benchmark: str, keep: str | None = None) -> list[str]:
    """Move the top-level results of `benchmark` (files `<benchmark>-*`) into history/, except the stem `keep`;
    a name already taken there gets a numbered suffix. Returns where they went."""
    moved = []
    os.makedirs(HISTORY, exist_ok=True)
    for path in sorted(glob.glob(os.path.join(RESULTS, f"{benchmark}-*.*"))):
        stem, ext = os.path.splitext(path)
        if keep is not None and os.path.abspath(stem) == os.path.abspath(keep):
            continue
        name = os.path.basename(stem)
        target, n = os.path.join(HISTORY, name), 1
        while os.path.exists(target + ext):
            n += 1
            target = os.path.join(HISTORY, f"{name}-{n}")
        shutil.move(path, target + ext)
        moved.append(target + ext)
    return moved


def write(stem: str, results: dict[str, Any], markdown: str) -> None:
    """`stem`.json and `stem`.md; when `stem` is a top-level result, earlier runs of its benchmark move to history/
    first (an earlier result of the very same stem too: it is renamed, not overwritten)."""
    if os.path.dirname(os.path.abspath(stem)) == os.path.abspath(RESULTS):
        benchmark = os.path.basename(stem).split("-")[0]
        retire(benchmark)
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(results, f, indent=1, default=float)
        f.write("\n")
    with open(stem + ".md", "w") as f:
        f.write(markdown)
