"""What a cluster administrator lets a DisaggregatedServing ask for, beyond what its CRD allows anyone who may
create one: creating a serving creates pods, so the fields that would make those pods privileged on their node are
off unless the operator is told otherwise (its flags; the chart's `policy` values).

* `network.efa.privileged`: a privileged engine container (`--allow-privileged-efa`).
* `model.cache.hostPath`: a node directory mounted into the engines, only under the prefixes given
  (`--allow-host-path PREFIX`, repeatable; none: no hostPath at all). A prefix matches whole path components.
* images (`model.image`, `router.image`, `network.preflight.image`): when `--allow-image PREFIX` is given (repeatable),
  only images that start with one of them, e.g. `123456789012.dkr.ecr.us-west-2.amazonaws.com/`; none given: any.
  A pod runs what its image holds with the Secrets its env names, so a cluster that limits who reads Secrets limits
  images too.

A serving that asks for more is refused like an invalid spec: its children stay as they are, and its status and a
Warning Event say which field and which flag.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass

from duplex.api.spec import DisaggregatedServingSpec

ENV = "DUPLEX_POLICY"  # how the operator's command line hands the policy to its reconcile workers


@dataclass(frozen=True)
class Policy:
    allow_privileged_efa: bool = False
    host_path_prefixes: tuple[str, ...] = ()
    image_prefixes: tuple[str, ...] = ()  # empty: any image

    def violations(self, spec: DisaggregatedServingSpec) -> list[str]:
        out = []
        if spec.network.efa.enabled and spec.network.efa.privileged and not self.allow_privileged_efa:
            out.append(
                "spec.network.efa.privileged: privileged engine pods are not allowed by this operator "
                "(its administrator can allow them: --allow-privileged-efa, chart value policy.allowPrivilegedEFA)"
            )
        cache = spec.model.cache
        if cache is not None and cache.host_path is not None and not self.allows_host_path(cache.host_path.path):
            allowed = ", ".join(self.host_path_prefixes) or "none"
            out.append(
                f"spec.model.cache.hostPath.path: {cache.host_path.path} is not under a node directory this operator "
                f"allows (allowed: {allowed}; --allow-host-path, chart value policy.allowedHostPathPrefixes)"
            )
        if self.image_prefixes:
            images = {
                "spec.model.image": spec.model.image,
                "spec.router.image": spec.router.image,
                "spec.network.preflight.image": spec.network.preflight.image,
            }
            for field, image in images.items():
                if not image.startswith(self.image_prefixes):
                    out.append(
                        f"{field}: {image} is not from a registry this operator allows "
                        f"({', '.join(self.image_prefixes)}; --allow-image, chart value policy.allowedImagePrefixes)"
                    )
        return out

    def allows_host_path(self, path: str) -> bool:
        if posixpath.normpath(path) != path.rstrip("/") or "/../" in f"{path}/":
            return False  # "..", "//" or "/./": the path must name its directory plainly
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in self.host_path_prefixes)

    def to_env(self) -> str:
        return json.dumps(
            {
                "allow_privileged_efa": self.allow_privileged_efa,
                "host_paths": self.host_path_prefixes,
                "images": self.image_prefixes,
            }
        )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Policy:
        raw = (os.environ if environ is None else environ).get(ENV)
        if not raw:
            return cls()
        data = json.loads(raw)
        return cls(
            bool(data.get("allow_privileged_efa")),
            tuple(data.get("host_paths") or ()),
            tuple(data.get("images") or ()),
        )


DEFAULT = Policy()  # nothing beyond the CRD: no privileged engines, no hostPath
