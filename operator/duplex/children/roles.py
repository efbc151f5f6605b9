"""The two engine roles as the builders take them: a role's name beside its part of the spec."""

from __future__ import annotations

from dataclasses import dataclass

from duplex.api.spec import DisaggregatedServingSpec, RoleSpec


@dataclass(frozen=True)
class EngineRole:
    name: str  # "prefill" or "decode": the role's child names and labels
    spec: RoleSpec  # what its engines run

    @property
    def multinode(self) -> bool:
        """Whether one engine instance spans nodes: the role is then a LeaderWorkerSet (lws.py), not a Deployment."""
        return self.spec.nodes_per_instance > 1

    @classmethod
    def of(cls, spec: DisaggregatedServingSpec, name: str) -> EngineRole:
        """The named role of a serving; a KeyError for any name but prefill and decode."""
        return cls(name, {"prefill": spec.prefill, "decode": spec.decode}[name])
