#!/usr/bin/env python3
"""Checks JSON documents against the schemas of docs/json.md.

    check_json.py SCHEMA [FILE ...] [--lines] [--definition NAME]
                  [--unordered]

Reads each FILE (or stdin) as one JSON document, or with --lines as JSON
lines (one document per non-empty line), and checks it against SCHEMA (or
against SCHEMA's definition NAME). Prints "ok: N documents" and exits 0, or
prints every violation as "FILE: PATH: problem" and exits 1. A schema that
uses anything outside the subset below is an error too (exit 2), so that a
typo in a schema cannot make it accept everything.

The subset of JSON Schema draft-07 (standard library only, no pip
packages in the test path):

  type                   a name or a list: object, array, string, number,
                         integer, boolean, null
  properties, required   members of an object
  additionalProperties   false, or a schema for the other members; every
                         schema with "properties" must say which
  items                  one schema for every element of an array
  enum                   the allowed values
  minimum, maxLength, minItems, maxItems
  pattern                a regular expression a string must match (re.search)
  $ref                   "#/definitions/NAME" only
  definitions, $schema, title, description, $comment   (annotations)

One addition: an object's members must appear in the order its
"properties" lists them (the writers keep a fixed order, and the lit tests
of the text output rely on it), so a reordering is drift too
(--unordered turns this off, for records written before).
"""

import argparse
import json
import re
import sys

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
KEYWORDS = {
    "type", "properties", "required", "additionalProperties", "items",
    "enum", "minimum", "maxLength", "minItems", "maxItems", "pattern", "$ref",
    "definitions", "$schema", "title", "description", "$comment",
}


class SchemaError(Exception):
    pass


def type_matches(value, name):
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if isinstance(value, bool):
        return False
    if name == "integer":
        return isinstance(value, int) or (
            isinstance(value, float) and value.is_integer())
    if name == "number":
        return isinstance(value, (int, float))
    raise SchemaError("unknown type '%s'" % name)


def check_schema(schema, where, root):
    """Refuses schemas outside the subset (recursively)."""
    if not isinstance(schema, dict):
        raise SchemaError("%s: a schema must be an object" % where)
    unknown = set(schema) - KEYWORDS
    if unknown:
        raise SchemaError("%s: unsupported keywords %s" %
                          (where, sorted(unknown)))
    types = schema.get("type", [])
    for t in types if isinstance(types, list) else [types]:
        if t not in TYPES:
            raise SchemaError("%s: unknown type '%s'" % (where, t))
    if "properties" in schema and "additionalProperties" not in schema:
        raise SchemaError("%s: says no 'additionalProperties'" % where)
    for name in schema.get("required", []):
        if name not in schema.get("properties", {}):
            raise SchemaError("%s: requires '%s', which it does not list" %
                              (where, name))
    if "$ref" in schema:
        resolve(schema["$ref"], root, where)
    for name, sub in schema.get("properties", {}).items():
        check_schema(sub, "%s.properties.%s" % (where, name), root)
    for key in ("items",):
        if key in schema:
            check_schema(schema[key], "%s.%s" % (where, key), root)
    extra = schema.get("additionalProperties")
    if extra is not None and extra is not False:
        if extra is True:
            raise SchemaError("%s: additionalProperties true is not strict" %
                              where)
        check_schema(extra, where + ".additionalProperties", root)
    for name, sub in schema.get("definitions", {}).items():
        check_schema(sub, "%s.definitions.%s" % (where, name), root)


def resolve(ref, root, where):
    prefix = "#/definitions/"
    if not ref.startswith(prefix):
        raise SchemaError("%s: only '#/definitions/NAME' references: %s" %
                          (where, ref))
    name = ref[len(prefix):]
    if name not in root.get("definitions", {}):
        raise SchemaError("%s: no definition '%s'" % (where, name))
    return root["definitions"][name]


def validate(value, schema, path, root, problems, ordered=True):
    if "$ref" in schema:
        schema = resolve(schema["$ref"], root, path)
    if "type" in schema:
        types = schema["type"]
        types = types if isinstance(types, list) else [types]
        if not any(type_matches(value, t) for t in types):
            problems.append("%s: %s is not of type %s" %
                            (path, json.dumps(value)[:60], "|".join(types)))
            return
    if "enum" in schema and value not in schema["enum"]:
        problems.append("%s: %s is not one of %s" %
                        (path, json.dumps(value)[:60],
                         json.dumps(schema["enum"])))
    if "minimum" in schema and isinstance(value, (int, float)) \
            and not isinstance(value, bool) and value < schema["minimum"]:
        problems.append("%s: %s is below the minimum %s" %
                        (path, value, schema["minimum"]))
    if "maxLength" in schema and isinstance(value, str) \
            and len(value) > schema["maxLength"]:
        problems.append("%s: %d characters, more than %d" %
                        (path, len(value), schema["maxLength"]))
    if "pattern" in schema and isinstance(value, str) \
            and not re.search(schema["pattern"], value):
        problems.append("%s: %s does not match %s" %
                        (path, json.dumps(value), schema["pattern"]))
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            problems.append("%s: %d items, fewer than %d" %
                            (path, len(value), schema["minItems"]))
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            problems.append("%s: %d items, more than %d" %
                            (path, len(value), schema["maxItems"]))
        if "items" in schema:
            for i, item in enumerate(value):
                validate(item, schema["items"], "%s[%d]" % (path, i), root,
                         problems, ordered)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                problems.append("%s: missing member '%s'" % (path, name))
        extra = schema.get("additionalProperties")
        order = list(props)
        last = -1
        for name, member in value.items():
            sub = "%s.%s" % (path, name)
            if name in props:
                at = order.index(name)
                if ordered and at < last:
                    problems.append("%s: member '%s' comes after '%s'" %
                                    (path, name, order[last]))
                last = max(last, at)
                validate(member, props[name], sub, root, problems, ordered)
            elif extra is False:
                problems.append("%s: unexpected member '%s'" % (path, name))
            elif isinstance(extra, dict):
                validate(member, extra, sub, root, problems, ordered)


def strict_object(pairs):
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError("a member name appears twice in %s" % names)
    return dict(pairs)


def reject_constant(name):
    raise ValueError("%s is not JSON" % name)


def parse(text):
    """json.loads without Python's extensions (NaN, Infinity) and without
    silently dropping duplicate members."""
    return json.loads(text, object_pairs_hook=strict_object,
                      parse_constant=reject_constant)


def documents(path, lines):
    name = "<stdin>" if path == "-" else path
    raw = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
    # The writers promise valid UTF-8: decoding strictly checks it.
    text = raw.decode("utf-8")
    if not lines:
        yield name, parse(text)
        return
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield "%s:%d" % (name, number), parse(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("schema")
    parser.add_argument("files", nargs="*", default=["-"])
    parser.add_argument("--lines", action="store_true",
                        help="JSON lines: one document per non-empty line")
    parser.add_argument("--definition",
                        help="check against this definition of the schema")
    parser.add_argument("--unordered", action="store_true",
                        help="do not check the order of members (records "
                        "written before the order was fixed)")
    args = parser.parse_intermixed_args()

    with open(args.schema) as f:
        root = json.load(f)
    try:
        check_schema(root, args.schema, root)
        schema = root
        if args.definition:
            schema = resolve("#/definitions/" + args.definition, root,
                             args.schema)
    except SchemaError as e:
        print("schema error: %s" % e)
        return 2

    count = 0
    failed = False
    for path in args.files:
        try:
            for name, doc in documents(path, args.lines):
                problems = []
                validate(doc, schema, "$", root, problems,
                         not args.unordered)
                count += 1
                for p in problems:
                    print("%s: %s" % (name, p))
                failed = failed or bool(problems)
        except (UnicodeDecodeError, ValueError) as e:
            print("%s: not valid JSON: %s" % (path, e))
            failed = True
    if count == 0 and not failed:
        print("no documents")
        return 1
    if failed:
        return 1
    print("ok: %d documents" % count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
