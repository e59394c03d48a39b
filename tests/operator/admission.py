"""An offline stand-in for the API server's admission of IgnisQueue and IgnisTopic objects: structural
defaulting, the OpenAPI schema (jsonschema) and every CEL rule (`x-kubernetes-validations`, evaluated with
the `cel` package), including transition rules against an old object. Used by the CRD tests. The CRD is
chosen by the object's `kind` (IgnisQueue when it has none)."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import cel
import yaml
from jsonschema import Draft7Validator

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "ignisqueues.ignismq.io.yaml"
TOPIC_CRD_PATH = ROOT / "crds" / "ignistopics.ignismq.io.yaml"
CRD_PATHS = {"IgnisQueue": CRD_PATH, "IgnisTopic": TOPIC_CRD_PATH}
_MISSING = object()


@cache
def crd(kind: str = "IgnisQueue") -> dict[str, Any]:
    return yaml.safe_load(CRD_PATHS[kind].read_text(encoding="utf-8"))


def schema(kind: str = "IgnisQueue") -> dict[str, Any]:
    (version,) = [v for v in crd(kind)["spec"]["versions"] if v["storage"]]
    return version["schema"]["openAPIV3Schema"]


def kind_of(obj: Any) -> str:
    return str(obj.get("kind") or "IgnisQueue") if isinstance(obj, dict) else "IgnisQueue"


def apply_defaults(node: dict[str, Any], value: Any) -> Any:
    """Kubernetes structural defaulting: absent properties with a `default` are filled, recursively
    (a default object is itself defaulted)."""
    if not isinstance(value, dict) or node.get("type") != "object":
        return value
    result = dict(value)
    for name, prop in (node.get("properties") or {}).items():
        if name not in result and "default" in prop:
            result[name] = copy.deepcopy(prop["default"])
        if name in result:
            result[name] = apply_defaults(prop, result[name])
    return result


@cache
def _validation_schema(kind: str) -> dict[str, Any]:
    """The schema as jsonschema should check it: `x-kubernetes-int-or-string` is the API server's type check of
    an integer or a string (a boolean there is refused), which JSON Schema spells as a list of types."""
    def convert(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: convert(v) for k, v in node.items()}
            if node.get("x-kubernetes-int-or-string") and "type" not in node:
                out["type"] = ["integer", "string"]
            return out
        return [convert(v) for v in node] if isinstance(node, list) else node

    return convert(schema(kind))


def schema_errors(obj: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, message) of every OpenAPI schema violation, sorted."""
    validator = Draft7Validator(_validation_schema(kind_of(obj)))
    return sorted((".".join(str(p) for p in e.absolute_path), e.message) for e in validator.iter_errors(obj))


def cel_errors(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(path, message) of every failing CEL rule. Transition rules (those using oldSelf) run only where
    the old object has a value at the same path, as in the API server."""
    errors: list[tuple[str, str]] = []
    _walk_cel(schema(kind_of(obj)), obj, old if old is not None else _MISSING, "", errors)
    return sorted(errors)


def _walk_cel(node: dict[str, Any], value: Any, old: Any, path: str, errors: list[tuple[str, str]]) -> None:
    for rule in node.get("x-kubernetes-validations") or []:
        transition = "oldSelf" in rule["rule"]
        if transition and old is _MISSING:
            continue
        context = {"self": value, **({"oldSelf": old} if transition else {})}
        try:
            passed = cel.evaluate(rule["rule"], context) is True
        except RuntimeError:  # an evaluation error (timestamp('2026-02-30T00:00:00Z')) refuses the object, and the
            passed = False  # API server names the rule's message: "<error> evaluating rule: <message>"
        if not passed:
            errors.append((path, rule["message"]))
    if isinstance(value, dict):
        for name, prop in (node.get("properties") or {}).items():
            if name in value:
                child_old = old.get(name, _MISSING) if isinstance(old, dict) else _MISSING
                _walk_cel(prop, value[name], child_old, f"{path}.{name}".lstrip("."), errors)


def admit(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """Everything the API server would reject, after defaulting both objects (schema errors first:
    the API server runs CEL only on schema-valid objects)."""
    sch = schema(kind_of(obj))
    obj = apply_defaults(sch, obj)
    problems = schema_errors(obj)
    if problems:
        return problems
    return cel_errors(obj, apply_defaults(sch, old) if old is not None else None)


def rules(kind: str = "IgnisQueue") -> list[tuple[str, dict[str, Any]]]:
    """Every (path, rule) of the schema."""
    found: list[tuple[str, dict[str, Any]]] = []

    def walk(node: dict[str, Any], path: str) -> None:
        found.extend((path, r) for r in node.get("x-kubernetes-validations") or [])
        for name, prop in (node.get("properties") or {}).items():
            walk(prop, f"{path}.{name}".lstrip("."))
        if "items" in node:
            walk(node["items"], f"{path}[]")

    walk(schema(kind), "")
    return found
