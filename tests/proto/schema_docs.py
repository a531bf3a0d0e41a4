#!/usr/bin/env python3
"""docs/protocol.md against the protocol's table (proto/schema.c, exported
as protocol.json by dspk_schema_json): the tables "Parameters of each
method" and "Options of each op" hold exactly one row per parameter of the
table, with its type, whether it is required, its default and its values,
and nothing the table lacks; the table "Results of each method" holds
exactly one row per result field, nested ones included (the fields of a map,
of each item of an array, of each value of a map keyed by names), with its
type, whether it is always there and its values, and nothing the table
lacks; every method has its own section naming every key of its result;
every op is in the table of ops; every key protocol.json uses is described
in the section "protocol.json", whose list of admin methods is the table's.
Also checks that the
Python package (python/dspk) calls only methods of the table, with only
their parameters.

usage: schema_docs.py PROTOCOL_JSON DOCS_PROTOCOL_MD [PYTHON_CLIENT]"""
import json
import re
import sys

PARAMS_HEAD = "| method | parameter | type | required | default | values |"
OPTIONS_HEAD = "| op | option | type | required | default | values |"
RESULTS_HEAD = "| method | field | type | always | values |"


def values(p):
    t = p["type"]
    if "values" in p:
        return p["values"]
    if t == "enum":
        return ", ".join(p["choices"])
    if t == "enum_list":
        return "list of: " + ", ".join(p["choices"])
    if t == "uint" and "max" in p:
        return "%d to %d" % (p.get("min", 0), p["max"])
    if t == "str":
        return "at most %d bytes" % p["max_bytes"]
    if t == "dim3":
        return "1 to 3 positive ints"
    if t == "array":
        lo, hi = p.get("min_items", 0), p.get("max_items")
        if hi is not None:
            v = "%d to %d items" % (lo, hi) if lo else \
                "at most %d item%s" % (hi, "" if hi == 1 else "s")
        else:
            v = ("at least %d item%s" % (lo, "s" if lo > 1 else "")) if lo else ""
        # Items that may be nil (task.run's outputs entries) say so, as a
        # result field's "T or nil" does.
        item = p.get("item") or {}
        if item.get("nil"):
            v += "%seach %s or nil" % (", " if v else "", item["type"])
        return v
    return ""


def row(owner, p):
    return "| %s | %s | %s | %s | %s | %s |" % (
        owner, p["name"], p["type"], "yes" if p["required"] else "no",
        p.get("default", ""), values(p))


def rtype(f):
    """A result field's type: "array of map", "uint or nil"."""
    t = f["type"]
    if t == "array" and "item" in f:
        t += " of " + f["item"]["type"]
    return t + (" or nil" if f.get("nil") else "")


def rvalues(f):
    if "keys" in f:
        return "keys: " + ", ".join(f["keys"])
    if f["type"] == "array" and "item" in f and f["item"].get("choices"):
        return "items: " + ", ".join(f["item"]["choices"])
    if f["type"] in ("enum", "enum_list"):
        return values(f)
    return ""


def result_rows(method, fields, prefix):
    """One row per field, then the rows of what it holds: "limits.max_rank",
    "devices[].id", "kinds.<key>" and "kinds.<key>.entries"."""
    rows = []
    for f in fields:
        path = prefix + f["name"]
        rows.append("| %s | %s | %s | %s | %s |" % (
            method, path, rtype(f), "yes" if f["required"] else "no", rvalues(f)))
        rows += nested_rows(method, f, path)
    return rows


def nested_rows(method, f, path):
    rows = []
    if "fields" in f:
        rows += result_rows(method, f["fields"], path + ".")
    item = f.get("item")
    if item and f["type"] == "array" and "fields" in item:
        rows += result_rows(method, item["fields"], path + "[].")
    if item and f["type"] == "map":
        key = path + ".<key>"
        rows.append("| %s | %s | %s | yes | %s |" % (method, key, rtype(item), rvalues(item)))
        rows += nested_rows(method, item, key)
    return rows


def expected_results(schema):
    rows = []
    for m in schema["methods"]:
        if m["result"] == "str":
            rows.append("| %s | — | str | | |" % m["name"])
        elif not m["result"]:
            rows.append("| %s | — | | | |" % m["name"])
        else:
            rows += result_rows(m["name"], m["result"], "")
    return rows


def expected(schema):
    params, options = [], []
    for m in schema["methods"]:
        if not m["params"]:
            params.append("| %s | — | | | | |" % m["name"])
        for p in m["params"]:
            params.append(row(m["name"], p))
            # The fields of an array's items, by path ("outputs[].buffer").
            for f in p.get("item", {}).get("fields", []):
                params.append(row(m["name"], dict(f, name=p["name"] + "[]." + f["name"])))
    for o in schema["ops"]:
        if not o["options"]:
            options.append("| %s | — | | | | |" % o["name"])
        options += [row(o["name"], p) for p in o["options"]]
    return params, options


def table_rows(lines, head):
    """The rows of the table whose header line is head."""
    try:
        i = lines.index(head)
    except ValueError:
        raise SystemExit("docs/protocol.md: no table headed %r" % head)
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        rows.append(re.sub(r" +", " ", line.strip()).replace("| |", "|  |"))
    return rows


def norm(r):
    return [c.strip() for c in r.strip().strip("|").split("|")]


def compare(what, want, got, errors):
    w = {tuple(norm(r)): r for r in want}
    g = {tuple(norm(r)): r for r in got}
    for k in w:
        if k not in g:
            errors.append("%s: missing or different in docs: %s" % (what, w[k]))
    for k in g:
        if k not in w:
            errors.append("%s: documented but not in the table: %s" % (what, g[k]))
    if [norm(r) for r in want] != [norm(r) for r in got] and not errors:
        errors.append("%s: rows in another order than the table" % what)


def sections(text):
    """Heading text -> section body, for the ### headings."""
    out = {}
    parts = re.split(r"^### (.*)$", text, flags=re.M)
    for i in range(1, len(parts), 2):
        out[parts[i]] = parts[i + 1]
    return out


def check_python(path, schema, errors):
    methods = {m["name"]: {p["name"] for p in m["params"]} for m in schema["methods"]}
    src = open(path).read()
    ops = re.search(r"_OPS = \(([^)]*)\)", src)
    if not ops:
        errors.append("%s: no _OPS list" % path)
    else:
        table_ops = {o["name"] for o in schema["ops"]}
        for op in re.findall(r'"([a-z_]+)"', ops.group(1)):
            if op not in table_ops:
                errors.append("%s: _OPS names %r, not an op of the table" % (path, op))
    calls = re.findall(r'_(?:call|start)\(\s*"([a-z_.]+)"\s*(?:,\s*\{([^}]*)\})?', src)
    if not calls:
        errors.append("%s: no method calls found" % path)
    for name, args in calls:
        if name not in methods:
            errors.append("%s: calls %r, not a method of the table" % (path, name))
            continue
        for key in re.findall(r'"([a-z_]+)"\s*:', args or ""):
            if key not in methods[name]:
                errors.append("%s: %s with %r, not a parameter of the table" % (path, name, key))


def row_key_kinds(schema):
    """{key: {"parameter", "result"}}: which kinds of row (a parameter or an
    op's option, at any depth, or a result field) use each row key."""
    kinds = {}

    def walk(row, kind):
        for k in row:
            kinds.setdefault(k, set()).add(kind)
        for f in row.get("fields") or []:
            walk(f, kind)
        if isinstance(row.get("item"), dict):
            walk(row["item"], kind)
    for m in schema["methods"]:
        for p in m["params"]:
            walk(p, "parameter")
        for f in m["result"] if isinstance(m["result"], list) else []:
            walk(f, "result")
    for o in schema["ops"]:
        for p in o["options"]:
            walk(p, "parameter")
    return kinds


def key_description(sec, key):
    """The parenthesis after "`key` (" in the protocol.json section (nested
    parentheses included), or "" when there is none."""
    i = sec.find("`%s` (" % key)
    if i < 0:
        return ""
    i += len(key) + 4
    depth, j = 1, i
    while j < len(sec) and depth:
        depth += {"(": 1, ")": -1}.get(sec[j], 0)
        j += 1
    return " ".join(sec[i:j - 1].split())


def main():
    schema = json.load(open(sys.argv[1]))
    text = open(sys.argv[2]).read()
    lines = text.splitlines()
    errors = []
    want_p, want_o = expected(schema)
    compare("parameters", want_p, table_rows(lines, PARAMS_HEAD), errors)
    compare("options", want_o, table_rows(lines, OPTIONS_HEAD), errors)
    compare("results", expected_results(schema), table_rows(lines, RESULTS_HEAD), errors)
    secs = sections(text)
    for m in schema["methods"]:
        heads = [h for h in secs if re.search(r"(^|[ ,])%s([ ,(]|$)" % re.escape(m["name"]), h)]
        if not heads:
            errors.append("method %s: no ### section" % m["name"])
            continue
        body = "".join(secs[h] for h in heads)
        for key in [f["name"] for f in m["result"]] if isinstance(m["result"], list) else []:
            if not re.search(r"\b%s\b" % re.escape(key), body):
                errors.append("method %s: result key %r not in its section" % (m["name"], key))
    run = secs.get("task.run", "")
    for o in schema["ops"]:
        if not re.search(r"^\| %s \|" % re.escape(o["name"]), run, flags=re.M):
            errors.append("op %s: not in the table of ops of task.run" % o["name"])
    # Every key protocol.json uses is described in its section ("admin",
    # "nil", "min_items", "choices", "max_bytes" were in no part of the page),
    # and the admin methods it names are the ones that section lists.
    sec = secs.get("protocol.json", "")
    if not sec:
        errors.append("no ### protocol.json section")
    keys = set()

    def walk(o):
        if isinstance(o, dict):
            keys.update(o)
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
    walk(schema)
    for k in sorted(keys):
        if not re.search(r"`%s`" % re.escape(k), sec):
            errors.append("protocol.json key %r not described in its section" % k)
    # A row key whose description names the kinds of row it applies to
    # ("`nil` (... this result field ...)") names every kind that uses it:
    # protocol.json had `nil` on a parameter's item with only results
    # defining it (probe 18 A4).
    used = row_key_kinds(schema)
    for k in sorted(used):
        desc = key_description(sec, k)
        named = {kind for kind, word in (("parameter", "parameter"), ("result", "result"))
                 if word in desc}
        if named and used[k] - named:
            errors.append("protocol.json key %r is used on %s rows, its description (%r) "
                          "names only %s" % (k, " and ".join(sorted(used[k])), desc,
                                             " and ".join(sorted(named))))
    admins = {m["name"] for m in schema["methods"] if m["admin"]}
    mt = re.search(r"`admin`: `true`(.*?)else `false`", sec, re.S)
    named = {n for n in re.findall(r"`([a-z.]+)`", mt.group(1) if mt else "")
             if n in {m["name"] for m in schema["methods"]}}
    if admins != named:
        errors.append("protocol.json section names admin methods %s, the table %s"
                      % (sorted(named), sorted(admins)))
    if len(sys.argv) > 3:
        check_python(sys.argv[3], schema, errors)
    for e in errors:
        print(e)
    if errors:
        return 1
    print("docs/protocol.md matches the table: %d methods, %d ops, %d result fields" %
          (len(schema["methods"]), len(schema["ops"]), len(expected_results(schema))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
