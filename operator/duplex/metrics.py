"""Prometheus metrics of the operator."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("duplex_reconciles_total", "Reconcile passes.", ["result"])
RECONCILE_ERRORS = Counter("duplex_reconcile_errors_total", "Reconcile passes that failed.", ["error"])
RECONCILE_SECONDS = Histogram(
    "duplex_reconcile_duration_seconds",
    "Duration of a reconcile pass.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
WRITES = Counter("duplex_api_writes_total", "Write calls to the API server.", ["verb", "kind"])
MANAGED_OBJECTS = Gauge("duplex_managed_objects", "Child objects owned, by kind.", ["namespace", "serving", "kind"])
SERVINGS = Gauge("duplex_servings", "DisaggregatedServings being reconciled.")
