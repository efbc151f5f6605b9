"""Generate the DisaggregatedServing CRD from the pydantic models (structural OpenAPI v3 + CEL rules)."""

from __future__ import annotations

import typing
from collections.abc import Callable
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
    """pydantic's JSON schema -> a structural OpenAPI v3 schema: references inlined, nullable unions collapsed,
    each JSON-schema keyword rewritten by its own small function (KEYWORDS), then the model class's CEL rules and
    docstring attached."""

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
            return self._reference(node)
        if "anyOf" in node:
            return self._nullable(node)
        out: dict[str, Any] = {}
        for key, value in node.items():
            KEYWORDS.get(key, _copy)(self, out, key, value, cls)
        return _finish(out, cls)

    def _reference(self, node: dict[str, Any]) -> dict[str, Any]:
        """A `$ref` to a model: its definition, with the referring node's own keywords (description, default)."""
        name = node["$ref"].rsplit("/", 1)[-1]
        merged = {**self.defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
        return self._node(merged, self.classes.get(name))

    def _nullable(self, node: dict[str, Any]) -> dict[str, Any]:
        """`X | None` is X: the API server prunes nulls, so no field needs to be nullable."""
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if [o.get("type") for o in options] == ["integer", "string"]:
            # int | str: the API server's int-or-string; which values it takes is a CEL rule of the model's
            rest = {k: v for k, v in node.items() if k in ("description", "default")}
            return {"x-kubernetes-int-or-string": True, **rest}
        if len(options) != 1:
            raise ValueError(f"cannot express union in a structural schema: {node}")
        rest = {k: v for k, v in node.items() if k not in ("anyOf", "default")}
        if node.get("default") is not None:
            rest["default"] = node["default"]
        return self._node({**options[0], **rest})


Keyword = Callable[[_Converter, dict[str, Any], str, Any, "type[BaseModel] | None"], None]


def _copy(conv: _Converter, out: dict[str, Any], key: str, value: Any, cls: type[BaseModel] | None) -> None:
    out[key] = value


def _drop(conv: _Converter, out: dict[str, Any], key: str, value: Any, cls: type[BaseModel] | None) -> None:
    pass


def _properties(conv: _Converter, out: dict[str, Any], key: str, value: Any, cls: type[BaseModel] | None) -> None:
    """Each property converted; a default_factory's value becomes the schema default (API server defaulting)."""
    out["properties"] = {}
    for prop, sub in value.items():
        converted = conv._node(sub)
        if cls is not None and "default" not in converted:
            default = _factory_default(cls, prop)
            if default is not None:
                converted["default"] = default
        out["properties"][prop] = converted


def _items(conv: _Converter, out: dict[str, Any], key: str, value: Any, cls: type[BaseModel] | None) -> None:
    out["items"] = conv._node(value)


def _additional_properties(
    conv: _Converter, out: dict[str, Any], key: str, value: Any, cls: type[BaseModel] | None
) -> None:
    if isinstance(value, dict) and value:  # `true`/`{}` (anything goes) is the structural default: left out
        out["additionalProperties"] = conv._node(value)


def _const(conv: _Converter, out: dict[str, Any], key: str, value: Any, cls: type[BaseModel] | None) -> None:
    out["enum"] = [value]  # structural schemas have no `const`


def _exclusive_bound(conv: _Converter, out: dict[str, Any], key: str, value: Any, cls: type[BaseModel] | None) -> None:
    """JSON Schema's numeric exclusive bound -> OpenAPI v3's bound plus a boolean flag."""
    if isinstance(value, bool):
        out[key] = value
        return
    out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
    out[key] = True


def _default(conv: _Converter, out: dict[str, Any], key: str, value: Any, cls: type[BaseModel] | None) -> None:
    if value is not None and value not in ([], {}):  # empty defaults add nothing and clutter `kubectl explain`
        out["default"] = value


KEYWORDS: dict[str, Keyword] = {
    **dict.fromkeys((*_DROP, "$defs"), _drop),
    "properties": _properties,
    "items": _items,
    "additionalProperties": _additional_properties,
    "const": _const,
    "exclusiveMinimum": _exclusive_bound,
    "exclusiveMaximum": _exclusive_bound,
    "default": _default,
}


def _finish(out: dict[str, Any], cls: type[BaseModel] | None) -> dict[str, Any]:
    """What a converted node needs beyond its keywords."""
    _structural(out)
    if cls is not None:
        _from_model(out, cls)
    return out


def _structural(out: dict[str, Any]) -> None:
    """Objects that keep unknown fields declare no value schema; an enum needs its type spelled out."""
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out.pop("additionalProperties", None)
        out["type"] = "object"
    if "enum" in out and "type" not in out:
        out["type"] = "string" if all(isinstance(v, str) for v in out["enum"]) else "integer"


def _from_model(out: dict[str, Any], cls: type[BaseModel]) -> None:
    """The model's cross-field rules as CEL, and its docstring as the description if the field gave none."""
    if issubclass(cls, Checked) and cls.RULES:
        out["x-kubernetes-validations"] = [r.schema() for r in cls.RULES]
    if cls.__doc__ and "description" not in out:
        out["description"] = " ".join(cls.__doc__.split())


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
