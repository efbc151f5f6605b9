"""Every benchmark module imports against the code as it is now: a name renamed in the product must not leave a
benchmark broken until someone runs it (the benchmarks are not in the suite; their imports are)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# Imported only by what draws plots or runs a contender: the `bench` extra, which the suite does not install.
OPTIONAL = {"matplotlib", "vllm_router"}


@pytest.mark.parametrize("module", sorted(p.stem for p in BENCH.glob("*.py")))
def test_the_benchmark_module_imports(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] not in OPTIONAL:
            raise
    finally:
        for name in [n for n, m in sys.modules.items() if getattr(m, "__file__", "") and str(BENCH) in str(m.__file__)]:
            del sys.modules[name]
