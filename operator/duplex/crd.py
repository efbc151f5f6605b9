"""Generate the DisaggregatedServing CRD from the pydantic models (structural OpenAPI v3 + CEL rules)."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel

from duplex.api.meta import GROUP, KIND, PLURAL, SHORT_NAME, SINGULAR, VERSION
from duplex.api.naming import NAME_RULE
from duplex.api.rules import Checked
from duplex.api.spec import DisaggregatedServingSpec
from duplex.api.status import DisaggregatedServingStatus

PRINTER_COLUMNS = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Prefill", "type": "string", "jsonPath": ".status.prefill.summary", "description": "ready/desired"},
    {"name": "Decode", "type": "string", "jsonPath": ".status.decode.summary", "description": "ready/desired"},
    {"name": "Bidirectional", "type": "boolean", "jsonPath": ".spec.kvTransfer.bidirectional"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
_DROP = {"title"}


def _model_classes(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model class reachable from root, by class name (pydantic's $defs keys)."""
    found: dict[str, type[BaseModel]] = {}

    def visit(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp.__name__ in found:
                return
            found[tp.__name__] = tp
            for field in tp.model_fields.values():
                visit(field.annotation)
            return
        for arg in typing.get_args(tp):
            visit(arg)

    visit(root)
    return found


def _factory_default(cls: type[BaseModel], prop_alias: str) -> Any:
    for name, field in cls.model_fields.items():
        if (field.alias or name) == prop_alias and field.default_factory is not None:
            value = field.default_factory()  # type: ignore[call-arg]
            if isinstance(value, BaseModel):
                # The fully defaulted object: the API server checks a default against the CEL rules as written.
                return _prune(value.model_dump(by_alias=True, exclude_none=True, mode="json"))
    return None


def _prune(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in value.items() if v not in ([], {})}
    return value


class _Converter:
    def __init__(self, root: type[BaseModel]) -> None:
        self.schema = root.model_json_schema(by_alias=True, mode="validation")
        self.defs = self.schema.get("$defs", {})
        self.classes = _model_classes(root)

    def convert(self) -> dict[str, Any]:
        return self._node(self.schema, self.classes[self._root_name()])

    def _root_name(self) -> str:
        title: str = self.schema["title"]
        return title

    def _node(self, node: dict[str, Any], cls: type[BaseModel] | None = None) -> dict[str, Any]:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            merged = {**self.defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
            return self._node(merged, self.classes.get(name))
        if "anyOf" in node:
            options = [o for o in node["anyOf"] if o.get("type") != "null"]
            if len(options) != 1:
                raise ValueError(f"cannot express union in a structural schema: {node}")
            rest = {k: v for k, v in node.items() if k not in ("anyOf", "default")}
            if node.get("default") is not None:
                rest["default"] = node["default"]
            return self._node({**options[0], **rest})
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROP or key == "$defs":
                continue
            if key == "properties":
                out["properties"] = {}
                for prop, sub in value.items():
                    converted = self._node(sub)
                    if cls is not None and "default" not in converted:
                        fd = _factory_default(cls, prop)
                        if fd is not None:
                            converted["default"] = fd
                    out["properties"][prop] = converted
            elif key == "items":
                out["items"] = self._node(value)
            elif key == "additionalProperties":
                if isinstance(value, dict) and value:
                    out["additionalProperties"] = self._node(value)
            elif key == "const":
                out["enum"] = [value]
            elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
            elif (key == "default" and value is None) or (key == "default" and value in ([], {})):
                continue
            else:
                out[key] = value
        if out.get("x-kubernetes-preserve-unknown-fields"):
            out.pop("additionalProperties", None)
            out["type"] = "object"
        if "enum" in out and "type" not in out:
            out["type"] = "string" if all(isinstance(v, str) for v in out["enum"]) else "integer"
        if cls is not None and issubclass(cls, Checked) and cls.RULES:
            out["x-kubernetes-validations"] = [r.schema() for r in cls.RULES]
        if cls is not None and cls.__doc__ and "description" not in out:
            out["description"] = " ".join(cls.__doc__.split())
        return out


def _status_schema() -> dict[str, Any]:
    schema = _Converter(DisaggregatedServingStatus).convert()
    schema["x-kubernetes-preserve-unknown-fields"] = True
    schema.pop("additionalProperties", None)
    return schema


def openapi_schema() -> dict[str, Any]:
    spec = _Converter(DisaggregatedServingSpec).convert()
    return {
        "type": "object",
        "description": "A prefill-decode disaggregated vLLM deployment with bidirectional KV transfer and a KV-aware router.",
        "required": ["spec"],
        "x-kubernetes-validations": [NAME_RULE.schema()],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": _status_schema(),
        },
    }


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "duplex"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": [SHORT_NAME],
                "categories": ["duplex"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }
