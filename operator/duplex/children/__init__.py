"""Pure builders: a DisaggregatedServing in, the Kubernetes objects it owns out."""
