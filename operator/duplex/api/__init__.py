"""The DisaggregatedServing API: pydantic models that generate the CRD schema and validate specs offline."""

from duplex.api.spec import DisaggregatedServingSpec, RoleSpec
from duplex.api.meta import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAME, SINGULAR, VERSION

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
