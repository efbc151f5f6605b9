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
* Secrets (`model.hfTokenSecret`, `router.store.redis.urlSecret`, `router.clientKeysSecret`, and
  `valueFrom.secretKeyRef` in `model`, `prefill` and `decode` env): when `--allow-secret NAME` is given (repeatable),
  only those Secrets of the serving's namespace; none given: any (its pods could read them as a Deployment's could).
* tolerations (`prefill.tolerations`, `decode.tolerations`; the accelerator taints duplex tolerates itself are not
  among them): only of the taint keys given (`--allow-toleration KEY`, repeatable; `*` also allows a toleration
  without a key, which tolerates every taint); none given: no extra toleration. A toleration is a way onto nodes the
  administrator set aside (system nodes, another team's).

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
    secret_names: tuple[str, ...] = ()  # empty: any Secret of the serving's namespace
    toleration_keys: tuple[str, ...] = ()  # empty: no toleration beyond duplex's own; "*": any, keyless too

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
        out += self._secret_violations(spec) + self._toleration_violations(spec)
        return out

    def _secret_violations(self, spec: DisaggregatedServingSpec) -> list[str]:
        if not self.secret_names:
            return []
        out = []
        for field, name in secret_refs(spec):
            if name not in self.secret_names:
                out.append(
                    f"{field}: Secret {name} is not one this operator lets servings read "
                    f"({', '.join(self.secret_names)}; --allow-secret, chart value policy.allowedSecrets)"
                )
        return out

    def _toleration_violations(self, spec: DisaggregatedServingSpec) -> list[str]:
        out = []
        for role in ("prefill", "decode"):
            for i, toleration in enumerate(getattr(spec, role).tolerations):
                key = toleration.get("key") or ""
                if "*" in self.toleration_keys or (key and key in self.toleration_keys):
                    continue
                what = f"taint key {key}" if key else "a toleration without a key (every taint)"
                allowed = ", ".join(self.toleration_keys) or "none"
                out.append(
                    f"spec.{role}.tolerations[{i}]: {what} is not one this operator lets servings tolerate "
                    f"(allowed: {allowed}; --allow-toleration, chart value policy.allowedTolerationKeys)"
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
                "secrets": self.secret_names,
                "tolerations": self.toleration_keys,
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
            tuple(data.get("secrets") or ()),
            tuple(data.get("tolerations") or ()),
        )


def secret_refs(spec: DisaggregatedServingSpec) -> list[tuple[str, str]]:
    """(field, Secret name) for every Secret a serving's pods or router read."""
    out = []
    if spec.model.hf_token_secret is not None:
        out.append(("spec.model.hfTokenSecret", spec.model.hf_token_secret.name))
    redis = spec.router.store.redis
    if redis is not None and redis.url_secret is not None:
        out.append(("spec.router.store.redis.urlSecret", redis.url_secret.name))
    if spec.router.client_keys_secret:
        out.append(("spec.router.clientKeysSecret", spec.router.client_keys_secret))
    for section in ("model", "prefill", "decode"):
        for i, var in enumerate(getattr(spec, section).env):
            ref = (var.value_from or {}).get("secretKeyRef")
            if isinstance(ref, dict):
                out.append((f"spec.{section}.env[{i}].valueFrom.secretKeyRef", str(ref.get("name") or "")))
    return out


DEFAULT = Policy()  # nothing beyond the CRD: no privileged engines, no hostPath
