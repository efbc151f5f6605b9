"""A local Kubernetes control plane for tests and the demo: real etcd, kube-apiserver, controller-manager and
scheduler, with kwok driving fake EKS EFA GPU nodes. `LocalCluster` is the Python API; `duplex-dev cluster` the CLI."""

from duplex_dev.cluster.local import ClusterError, ClusterStatus, LocalCluster

__all__ = ["ClusterError", "ClusterStatus", "LocalCluster"]
