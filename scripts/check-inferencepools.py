#!/usr/bin/env python3
"""Checks every InferencePool manifest against the InferencePool CRD's schema.

    scripts/check-inferencepools.py [--crd FILE] PATH...     (needs: pip install jsonschema pyyaml)

PATH is a manifest or a directory, searched for *.yaml and *.yml. Each document of kind
InferencePool is checked against the `openAPIV3Schema` of its version in the CRD
(tests/fixtures/crds/inferencepools.yaml, from the Gateway API Inference Extension's release;
its README says which). It is checked as the API server would take it under kubectl's default
strict field validation:

- a field the schema does not name is an error (not pruned);
- the schema's defaults are filled in, then its types, enums, bounds, patterns and required
  fields are checked (jsonschema, draft 4: the dialect of OpenAPI v3 schemas);
- `x-kubernetes-list-type: set` and `map` lists must not repeat an item or a key;
- each CEL rule (`x-kubernetes-validations`) is checked by its Python equivalent below. A rule
  that has none (a newer CRD) fails the check, so no rule is skipped without notice.

Exits 1 when a pool breaks the schema, when a file holds an InferencePool of another API
group or of a version the CRD does not serve, or when no InferencePool is found at all.
"""

import argparse
import copy
import pathlib
import sys

import jsonschema
import yaml

DEFAULT_CRD = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/crds/inferencepools.yaml"

# The CRD's CEL rules, each with what it says in Python. The value it gets is the node the
# rule is attached to, after defaulting (as the API server evaluates it).
CEL_RULES = {
    # endpointPickerRef: a Service (the default kind) needs a port.
    "self.kind != 'Service' || has(self.port)": lambda ref: ref.get("kind") != "Service" or "port" in ref,
    # targetPorts: each number once.
    "self.all(p1, self.exists_one(p2, p1.number==p2.number))": lambda ports: all(
        sum(q.get("number") == p.get("number") for q in ports) == 1 for p in ports
    ),
}

# The Kubernetes extensions this check understands; any other one in the CRD stops it.
KNOWN_EXTENSIONS = {
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-preserve-unknown-fields",
}


def close(schema, at="openAPIV3Schema"):
    """The schema with unknown fields forbidden and `nullable` spelt as JSON Schema does."""
    for key in schema:
        if key.startswith("x-kubernetes-") and key not in KNOWN_EXTENSIONS:
            sys.exit(f"{at}: the CRD uses {key}, which this check does not understand")
    schema = dict(schema)
    if schema.get("nullable") and "type" in schema:
        schema["type"] = [schema["type"], "null"]
    if "properties" in schema:
        schema["properties"] = {k: close(v, f"{at}.{k}") for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        schema["additionalProperties"] = close(schema["additionalProperties"], f"{at}.*")
    if "items" in schema:
        schema["items"] = close(schema["items"], f"{at}[]")
    return schema


def fill_defaults(schema, value):
    """Kubernetes fills in defaults of absent fields inside the objects that are present."""
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                fill_defaults(sub, value[key])
        if isinstance(schema.get("additionalProperties"), dict):
            for key in value.keys() - schema.get("properties", {}).keys():
                fill_defaults(schema["additionalProperties"], value[key])
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            fill_defaults(schema["items"], item)


def rules(schema, value, at):
    """The list-type and CEL rules, as errors; run on a value that already fits the schema."""
    errors = []
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "set" and len({repr(v) for v in value}) != len(value):
        errors.append(f"{at}: a set with a repeated item")
    if list_type == "map":
        keys = [tuple(repr(item.get(k)) for k in schema.get("x-kubernetes-list-map-keys", [])) for item in value]
        if len(set(keys)) != len(keys):
            errors.append(f"{at}: a map list with a repeated key")
    for rule in schema.get("x-kubernetes-validations", []):
        check = CEL_RULES.get(rule["rule"])
        if check is None:
            sys.exit(f"{at}: the CRD's rule {rule['rule']!r} has no equivalent in this check")
        if not check(value):
            errors.append(f"{at}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                errors += rules(sub, value[key], f"{at}.{key}" if at else key)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += rules(schema["items"], item, f"{at}[{i}]")
    return errors


def int_format(bits):
    return lambda v: not isinstance(v, int) or -(2 ** (bits - 1)) <= v < 2 ** (bits - 1)


def load_crd(path):
    crd = yaml.safe_load(path.read_text())
    assert crd["kind"] == "CustomResourceDefinition", f"{path}: not a CRD"
    formats = jsonschema.FormatChecker()
    formats.checks("int32")(int_format(32))
    formats.checks("int64")(int_format(64))
    versions = {}
    for v in crd["spec"]["versions"]:
        if v.get("served"):
            raw = v["schema"]["openAPIV3Schema"]
            validator = jsonschema.Draft4Validator(close(raw), format_checker=formats)
            versions[v["name"]] = (raw, validator)
    return crd["spec"]["group"], crd["spec"]["names"]["kind"], versions


def manifests(paths):
    for path in map(pathlib.Path, paths):
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml"))
        else:
            yield path


def where(error):
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".") or "(top)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crd", type=pathlib.Path, default=DEFAULT_CRD)
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args()
    group, kind, versions = load_crd(args.crd)
    checked, failed = 0, 0
    for path in manifests(args.paths):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != kind:
                continue
            api_group, _, version = str(doc.get("apiVersion", "")).rpartition("/")
            name = f"{path}: {kind}/{(doc.get('metadata') or {}).get('name', '?')}"
            checked += 1
            if api_group != group or version not in versions:
                print(f"FAIL {name}: apiVersion {doc.get('apiVersion')!r} is not served by the CRD "
                      f"({', '.join(f'{group}/{v}' for v in versions)})")
                failed += 1
                continue
            raw, validator = versions[version]
            pool = copy.deepcopy(doc)
            fill_defaults(raw, pool)
            errors = [f"{where(e)}: {e.message}" for e in validator.iter_errors(pool)]
            # Not in the CRD's schema (the API server checks ObjectMeta itself), but a
            # manifest without a name cannot be applied.
            if not isinstance((doc.get("metadata") or {}).get("name"), str):
                errors.append("metadata.name: required")
            if not errors:
                errors = rules(raw, pool, "")
            for e in errors:
                print(f"FAIL {name}: {e}")
            failed += bool(errors)
            if not errors:
                print(f"ok   {name} ({group}/{version})")
    if checked == 0:
        sys.exit(f"no {kind} found in {' '.join(args.paths)}")
    if failed:
        sys.exit(f"{failed} of {checked} {kind} manifest(s) break the CRD {args.crd.name}")


if __name__ == "__main__":
    main()
