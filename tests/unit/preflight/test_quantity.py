"""Byte quantities in Kubernetes' notation."""

from __future__ import annotations

import pytest

from duplex_sidecars.preflight.quantity import format_bytes, parse_bytes, to_quantity


@pytest.mark.parametrize(
    ("text", "n"),
    [("5120Mi", 5120 << 20), ("2Gi", 2 << 30), ("64M", 64_000_000), ("1048576", 1 << 20), ("1.5Ki", 1536)],
)
def test_parse(text: str, n: int) -> None:
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["", "5 GB", "Mi", "-1", "5120mi"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_format_and_to_quantity() -> None:
    assert format_bytes(8 << 20) == "8 MiB"
    assert format_bytes(64 << 30) == "64 GiB"
    assert format_bytes(3 << 19) == "1.5 MiB"
    assert format_bytes(100) == "100 B"
    assert to_quantity(5120 << 20) == "5120Mi"
    assert to_quantity(3 << 10) == "3Ki"
    assert to_quantity(1000) == "1000"
