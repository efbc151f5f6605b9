"""The DisaggregatedServing API: pydantic models that generate the CRD schema and validate specs offline."""

from duplex.api.meta import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAME, SINGULAR, VERSION
from duplex.api.spec import DisaggregatedServingSpec, RoleSpec

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAME",
    "SINGULAR",
    "VERSION",
    "DisaggregatedServingSpec",
    "RoleSpec",
]
