#!/usr/bin/env python3
"""Writes the PodSpec schema of one Kubernetes release, trimmed to what names things.

Reads kube-apiserver's OpenAPI v3 document of the core group (api/openapi-spec/v3/
api__v1_openapi.json in the k8s.io/kubernetes module) and writes, for every type reachable from
io.k8s.api.core.v1.PodSpec, its properties and each property's type: a type name (`$ref`), a
list of one (`[Name]`), a map of one (`{Name}`), or a scalar; and which properties it requires. Descriptions are left out, so the
file is small and the test that reads it (crates/core/tests/podspec_schema.rs) stays offline.

    scripts/podspec-schema.py 1.37.2 > crates/core/tests/data/podspec-1.37.2.json

The module is fetched through the Go module proxy (`go mod download`) when not cached.
"""
import json
import subprocess
import sys

PREFIX = "io.k8s.api.core.v1."


def module_dir(version: str) -> str:
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@v{version}"],
        check=True, capture_output=True, text=True, cwd="/tmp",
        env={**__import__("os").environ, "GOFLAGS": "-mod=mod"},
    ).stdout
    return json.loads(out)["Dir"]


def type_of(prop: dict) -> str:
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1].removeprefix(PREFIX)
    if "allOf" in prop and prop["allOf"] and "$ref" in prop["allOf"][0]:
        return type_of(prop["allOf"][0])
    if prop.get("type") == "array":
        return "[" + type_of(prop.get("items", {})) + "]"
    if prop.get("type") == "object" and isinstance(prop.get("additionalProperties"), dict):
        return "{" + type_of(prop["additionalProperties"]) + "}"
    return prop.get("type", "any")


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: podspec-schema.py <kubernetes version, e.g. 1.37.2>")
    version = sys.argv[1]
    path = f"{module_dir(version)}/api/openapi-spec/v3/api__v1_openapi.json"
    schemas = json.load(open(path))["components"]["schemas"]
    out: dict = {}
    todo = ["PodSpec"]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        schema = schemas.get(PREFIX + name)
        if schema is None:
            continue  # a type of another group (Quantity, ObjectMeta, ...): names nothing here
        props = {p: type_of(s) for p, s in sorted(schema.get("properties", {}).items())}
        out[name] = {"properties": props, "required": sorted(schema.get("required", []))}
        for t in props.values():
            todo.append(t.strip("[]{}"))
    print(json.dumps({"kubernetes": version, "root": "PodSpec", "types": out}, indent=1, sort_keys=True))


main()
