"""A small JSON Schema validator for the keywords capabilities_schema.json uses (no third-party dependency).

Supported: type, enum, const, required, properties, additionalProperties, minProperties, items, minItems,
uniqueItems, minimum, minLength, anyOf, and local $ref ("#/$defs/name"). Any other keyword in a schema
raises ValueError, so the schema file cannot silently ask for a check that is not made.
"""

from __future__ import annotations

import json
from typing import Any

_KEYWORDS = frozenset({
    "$schema", "$id", "$defs", "title", "description", "type", "enum", "const", "required", "properties",
    "additionalProperties", "minProperties", "items", "minItems", "uniqueItems", "minimum", "minLength", "anyOf",
    "$ref",
})
_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _type_name(value: Any) -> str:
    return next((name for name, test in _TYPES.items() if name != "number" and test(value)), type(value).__name__)


def _join(path: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else part


class _Validator:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root

    def resolve(self, ref: str) -> dict[str, Any]:
        if not ref.startswith("#/"):
            raise ValueError(f"only local $ref is supported, got {ref!r}")
        node: Any = self.root
        for part in ref[2:].split("/"):
            node = node[part]
        return node

    def errors(self, value: Any, schema: dict[str, Any], path: str) -> list[str]:
        unknown = set(schema) - _KEYWORDS
        if unknown:
            raise ValueError(f"schema keyword(s) {sorted(unknown)} are not supported by schema_check")
        where = path or "<root>"
        if "$ref" in schema:
            return self.errors(value, self.resolve(schema["$ref"]), path)
        if "anyOf" in schema:
            return self._any_of(value, schema["anyOf"], path)
        if "type" in schema:
            allowed = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if not any(_TYPES[t](value) for t in allowed):
                return [f"{where}: expected {' or '.join(allowed)}, got {_type_name(value)} {json.dumps(value)}"]
        if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
            return [f"{where}: {json.dumps(value)} is not one of {json.dumps(schema['enum'])}"]
        if "const" in schema and value != schema["const"]:
            return [f"{where}: expected {json.dumps(schema['const'])}, got {json.dumps(value)}"]
        out: list[str] = []
        if isinstance(value, dict):
            out += self._object(value, schema, path)
        elif isinstance(value, list):
            out += self._array(value, schema, path)
        elif isinstance(value, str) and len(value) < schema.get("minLength", 0):
            out.append(f"{where}: must be at least {schema['minLength']} character(s) long")
        elif _TYPES["number"](value) and "minimum" in schema and value < schema["minimum"]:
            out.append(f"{where}: {value} is below the minimum {schema['minimum']}")
        return out

    def _types_of(self, schema: dict[str, Any]) -> set[str]:
        """JSON types a schema can accept (used to pick the anyOf branch a value was meant for)."""
        if "$ref" in schema:
            return self._types_of(self.resolve(schema["$ref"]))
        if "anyOf" in schema:
            return set().union(*(self._types_of(option) for option in schema["anyOf"]))
        if "type" in schema:
            return set(schema["type"]) if isinstance(schema["type"], list) else {schema["type"]}
        if "enum" in schema:
            return {_type_name(e) for e in schema["enum"]}
        return set(_TYPES)

    def _any_of(self, value: Any, options: list[dict[str, Any]], path: str) -> list[str]:
        fitting = [o for o in options if any(_TYPES[t](value) for t in self._types_of(o))]
        if not fitting:
            allowed = sorted(set().union(*(self._types_of(o) for o in options)))
            return [f"{path or '<root>'}: expected {' or '.join(allowed)}, got {_type_name(value)} {json.dumps(value)}"]
        first = self.errors(value, fitting[0], path)
        if first and any(not self.errors(value, o, path) for o in fitting[1:]):
            return []
        return first

    def _object(self, value: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
        out = [f"{path or '<root>'}: missing required field {name!r}" for name in schema.get("required", ())
               if name not in value]
        if len(value) < schema.get("minProperties", 0):
            out.append(f"{path or '<root>'}: needs at least {schema['minProperties']} entr(y/ies)")
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                out += self.errors(item, properties[key], _join(path, key))
            elif extra is False:
                out.append(f"{_join(path, key)}: unknown field")
            elif isinstance(extra, dict):
                out += self.errors(item, extra, _join(path, key))
        return out

    def _array(self, value: list[Any], schema: dict[str, Any], path: str) -> list[str]:
        out = []
        if len(value) < schema.get("minItems", 0):
            out.append(f"{path or '<root>'}: needs at least {schema['minItems']} item(s)")
        if schema.get("uniqueItems") and len({json.dumps(v, sort_keys=True) for v in value}) != len(value):
            out.append(f"{path or '<root>'}: items must be unique")
        if "items" in schema:
            for i, item in enumerate(value):
                out += self.errors(item, schema["items"], _join(path, i))
        return out


def validate(value: Any, schema: dict[str, Any]) -> list[str]:
    """Every violation of `schema` by `value`, as 'path: problem' lines; empty when valid."""
    return _Validator(schema).errors(value, schema, "")
