"""The engine API key of local runs. In a cluster the operator draws a random key into `<serving>-engine-key` and
both the engines (VLLM_API_KEY) and the router (DUPLEX_ENGINE_API_KEY) read it from there; locally no Secret
resolves, so real engines launched from the rendered env and the routers launched here share this fixed value."""

from __future__ import annotations

from duplex.children.engine_key import ENGINE_ENV, ROUTER_ENV

DEV_ENGINE_KEY = "duplex-dev-engine-key"
# What the router sends, for callers that go to the engines around it (engines refuse /v1 without it).
DEV_ENGINE_AUTH = {"Authorization": f"Bearer {DEV_ENGINE_KEY}"}

__all__ = ["DEV_ENGINE_AUTH", "DEV_ENGINE_KEY", "ENGINE_ENV", "ROUTER_ENV"]
