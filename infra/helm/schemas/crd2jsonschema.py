"""Turn one version of an upstream CustomResourceDefinition into a JSON Schema (draft 2020-12) for offline checks.

    python infra/helm/schemas/crd2jsonschema.py CRD.yaml VERSION OUT.json --source "owner/repo@tag:path"

What the API server does with a custom resource, and what this schema does instead:

- Fields a structural schema does not declare are pruned (or, with kubectl's default server-side field validation,
  refused). Here every object that declares `properties` gets `additionalProperties: false`, unless it is marked
  `x-kubernetes-preserve-unknown-fields: true` or declares `additionalProperties` itself: an unknown or misspelt
  field fails.
- Go (RE2) patterns that Python's `re` refuses are rewritten to equivalents: a global inline flag such as `(?i)` in
  the middle (`^(?i)(abort|warn)?$`) moves to the front (`(?i)^(abort|warn)?$`).
- OpenAPI v3.0 spellings become JSON Schema ones: `nullable: true` adds "null" to the type,
  `x-kubernetes-int-or-string: true` becomes integer-or-string, a boolean `exclusiveMinimum`/`exclusiveMaximum`
  becomes the numeric form.
- Dropped: descriptions, defaults, `x-kubernetes-list-*`/`-map-type` and CEL rules (`x-kubernetes-validations`;
  the count is printed so that the README can say what went unchecked), and the `status` subtree (never rendered).
- `apiVersion` and `kind` are pinned to the CRD's group/version and kind; `metadata` gets the ObjectMeta fields a
  chart may set (name, namespace, labels, annotations, ...), nothing else.

Only the standard library and PyYAML are used; the input is the CRD file of an upstream release (see SOURCES.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

KEEP = {
    "type",
    "properties",
    "required",
    "items",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "uniqueItems",
    "format",
    "additionalProperties",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "multipleOf",
}

OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 253},
        "namespace": {"type": "string"},
        "generateName": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": {"type": "object"}},
    },
}


class Counter:
    def __init__(self) -> None:
        self.cel_rules = 0


def python_pattern(pattern: str) -> str:
    """An RE2 pattern as Python `re` accepts it: global inline flags (`(?i)`) moved to the start."""
    flags = re.findall(r"\(\?[ims]+\)", pattern)
    if flags and not pattern.startswith(flags[0]):
        for f in flags:
            pattern = pattern.replace(f, "", 1)
        pattern = "".join(flags) + pattern
    re.compile(pattern)
    return pattern


def convert(node: Any, counter: Counter) -> Any:
    """One OpenAPI v3.0 (Kubernetes structural) schema node as JSON Schema."""
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        raise TypeError(f"unexpected schema node {node!r}")
    counter.cel_rules += len(node.get("x-kubernetes-validations", []))
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in KEEP:
            continue
        if key == "properties":
            out[key] = {name: convert(sub, counter) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = convert(value, counter)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [convert(sub, counter) for sub in value]
        elif key == "pattern":
            out[key] = python_pattern(value)
        else:
            out[key] = value
    for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if node.get(flag) is True and bound in out:
            out[flag] = out.pop(bound)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


def crd_schema(crd: dict[str, Any], version: str, source: str, sha256: str) -> tuple[dict[str, Any], int]:
    """The JSON Schema of `version` of `crd`, and how many CEL rules were dropped."""
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    [entry] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    root = dict(entry["schema"]["openAPIV3Schema"])
    props = dict(root.get("properties", {}))
    props.pop("status", None)
    root["properties"] = props
    counter = Counter()
    schema = convert(root, counter)
    schema["properties"]["apiVersion"] = {"const": f"{group}/{version}"}
    schema["properties"]["kind"] = {"const": kind}
    schema["properties"]["metadata"] = OBJECT_META
    schema["required"] = sorted({"apiVersion", "kind", "metadata", *schema.get("required", [])})
    schema["additionalProperties"] = False
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": f"Generated by crd2jsonschema.py from {source} (sha256 {sha256}), version {version}; "
        f"{counter.cel_rules} CEL rule(s) (x-kubernetes-validations) not represented.",
        "title": f"{kind} ({group}/{version})",
        **schema,
    }, counter.cel_rules


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("crd", type=Path)
    p.add_argument("version")
    p.add_argument("out", type=Path)
    p.add_argument("--source", required=True, help="where the CRD file came from, e.g. owner/repo@tag:path")
    args = p.parse_args()
    raw = args.crd.read_bytes()
    docs = [d for d in yaml.safe_load_all(raw) if d]
    [crd] = [d for d in docs if d.get("kind") == "CustomResourceDefinition"]
    schema, cel = crd_schema(crd, args.version, args.source, hashlib.sha256(raw).hexdigest())
    args.out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    print(f"{args.out}: {schema['title']}, {len(args.out.read_bytes())} bytes, {cel} CEL rules dropped")


if __name__ == "__main__":
    main()
