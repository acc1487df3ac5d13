"""SCIM PATCH (RFC 7644 s3.5.2) on a resource held as a document, and the `eq` filters of
list requests. A PATCH is applied to a copy, in full, and then checked like a PUT body,
so a request whose any operation fails changes nothing.

Paths: `attr`, `attr.sub`, `attr[sub eq "v"]`, `attr[sub eq "v"].sub`, each optionally
after a schema URN (the enterprise extension's attributes only after its own). Another
path, an unknown attribute or a filter that is not `attribute eq value` is 400
(invalidPath, invalidFilter); a `remove` without a path, or a filtered `replace` or
`remove` that matches nothing, is 400 noTarget.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

from gateway.api.scim_resources import READ_ONLY, canonical, check_attribute, scim_error
from gateway.api.scim_schemas import (
    ENTERPRISE,
    ENTERPRISE_ATTRIBUTES,
    MAX_MEMBERS,
    MAX_OPERATIONS,
    PATCH,
    USER,
    USER_ATTRIBUTES,
)
from gateway.storage.directory_tables import name_key

_PATH = re.compile(r"([A-Za-z$][\w$-]*)(?:\[(.+)\])?(?:\.([A-Za-z$][\w$-]*))?")
_FILTER = re.compile(
    r'\s*([A-Za-z$][\w$.:-]*)\s+(eq)\s+("(?:[^"\\]|\\.)*"|true|false|null)\s*', re.I
)
OPS = ("add", "remove", "replace")


@dataclass(frozen=True)
class Path:
    extension: bool  # an attribute of the enterprise extension (or the extension itself)
    attribute: str  # "" for the bare extension URN
    match: tuple[str, Any] | None  # [sub eq value]
    sub: str | None


def operations(body: Any) -> list[tuple[str, str | None, Any]]:
    """(op, path, value) of a PatchOp body, the op in lower case."""
    if not isinstance(body, dict) or body.get("schemas") != [PATCH]:
        raise scim_error(400, f"a PATCH body must have schemas [{PATCH}]", "invalidSyntax")
    ops = body.get("Operations", body.get("operations"))
    if not isinstance(ops, list) or not ops:
        raise scim_error(400, "Operations must be a non-empty list", "invalidSyntax")
    if len(ops) > MAX_OPERATIONS:
        raise scim_error(400, f"at most {MAX_OPERATIONS} operations per PATCH", "invalidValue")
    out = []
    for op in ops:
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise scim_error(400, "each operation needs an op", "invalidSyntax")
        name, path = op["op"].lower(), op.get("path")
        if name not in OPS:
            raise scim_error(400, f"op {op['op']!r} is not add, remove or replace", "invalidSyntax")
        if path is not None and (not isinstance(path, str) or not path.strip()):
            raise scim_error(400, "path must be a string", "invalidPath")
        if name != "remove" and "value" not in op:
            raise scim_error(400, f"{name} needs a value", "invalidValue")
        out.append((name, path, op.get("value")))
    return out


def equality(text: str) -> tuple[str, Any]:
    """`attribute eq value` -> (attribute, value); 400 invalidFilter for anything else."""
    found = _FILTER.fullmatch(text)
    if found is None:
        raise scim_error(400, "only `attribute eq value` filters are supported", "invalidFilter")
    try:
        value = json.loads(found.group(3))
    except ValueError:
        raise scim_error(400, "the filter's value is not a JSON string", "invalidFilter") from None
    return found.group(1), value


def parse_path(text: str) -> Path:
    lowered = text.lower()
    extension = False
    if lowered == ENTERPRISE.lower():
        return Path(True, "", None, None)
    if lowered.startswith(ENTERPRISE.lower() + ":"):
        extension, text = True, text[len(ENTERPRISE) + 1 :]
    elif lowered.startswith(USER.lower() + ":"):
        text = text[len(USER) + 1 :]
    found = _PATH.fullmatch(text)
    if found is None:
        raise scim_error(400, f"path {text!r} is not a supported attribute path", "invalidPath")
    table = ENTERPRISE_ATTRIBUTES if extension else USER_ATTRIBUTES
    name = canonical(found.group(1), table)
    if name is None and not extension and found.group(1).lower() == "externalid":
        name = "externalId"
    if name is None:
        raise scim_error(400, f"path {text!r} names no attribute", "invalidPath")
    match = equality(found.group(2)) if found.group(2) else None
    sub = found.group(3)
    if name != "externalId":
        subs = table[name][3]
        if (match or sub) and not subs:
            raise scim_error(400, f"{name} has no sub-attributes", "invalidPath")
        if sub is not None:
            sub = canonical(sub, subs)
            if sub is None:
                raise scim_error(400, f"path {text!r} names no sub-attribute", "invalidPath")
        if match is not None:
            key = canonical(match[0], subs)
            if key is None or not table[name][1]:
                problem = f"the filter in {text!r} names no sub-attribute"
                raise scim_error(400, problem, "invalidFilter")
            match = (key, match[1])
    return Path(extension, name, match, sub)


def patch_user(doc: dict[str, Any], ops: list[tuple[str, str | None, Any]]) -> dict[str, Any]:
    """The user document after every operation (a copy; `doc` is untouched)."""
    doc = copy.deepcopy(doc)
    for op, path, value in ops:
        if path is None:
            if op == "remove":
                raise scim_error(400, "remove needs a path", "noTarget")
            if not isinstance(value, dict):
                raise scim_error(400, f"{op} without a path needs an object", "invalidValue")
            for key, item in value.items():
                if key.lower() in READ_ONLY:
                    continue  # Okta sends the id back in a replace
                _apply(doc, op, parse_path(key), item)
        else:
            target = parse_path(path)
            if target.attribute.lower() == "groups":
                raise scim_error(400, "groups is read-only: change a Group's members", "mutability")
            _apply(doc, op, target, value)
    return doc


def _apply(doc: dict[str, Any], op: str, path: Path, value: Any) -> None:
    if path.attribute == "":  # the whole extension
        if op == "remove":
            doc.pop(ENTERPRISE, None)
            return
        if not isinstance(value, dict):
            raise scim_error(400, f"{ENTERPRISE} must be an object", "invalidValue")
        holder = doc.setdefault(ENTERPRISE, {})
        for key, item in value.items():
            if key.lower() not in READ_ONLY:  # a client may send the extension's schemas
                _apply(doc, op, parse_path(f"{ENTERPRISE}:{key}"), item)
        if not holder:
            doc.pop(ENTERPRISE, None)
        return
    holder = doc.setdefault(ENTERPRISE, {}) if path.extension else doc
    table = ENTERPRISE_ATTRIBUTES if path.extension else USER_ATTRIBUTES
    name = path.attribute
    if name == "externalId":
        if op == "remove":
            holder.pop(name, None)
        else:
            holder[name] = value
        return
    multi = table[name][1]
    if path.match is None and path.sub is None:
        if op == "remove":
            holder.pop(name, None)
        elif op == "add" and multi and name in holder:
            holder[name] = _added(name, holder[name], check_attribute(name, value, table) or [])
        elif op == "add" and table[name][3] and not multi and isinstance(holder.get(name), dict):
            holder[name] = {**holder[name], **(check_attribute(name, value, table) or {})}
        else:
            holder[name] = check_attribute(name, value, table)
            if holder[name] is None:
                del holder[name]
        return
    if not multi:  # `name.sub` of a single complex attribute
        current = dict(holder.get(name) or {})
        assert path.sub is not None
        if op == "remove":
            current.pop(path.sub, None)
        else:
            current[path.sub] = value
        holder[name] = current
        if not current:
            del holder[name]
        return
    _apply_filtered(holder, op, name, path, value, table)


def _added(name: str, present: list[Any], added: list[Any]) -> list[Any]:
    """`present` and those of `added` not among them, compared as canonical JSON (a set, so
    100 operations of 1,000 values each cost no quadratic scan); past MAX_MEMBERS values
    this operation is refused at once, not after every operation has grown the list."""
    seen = {json.dumps(v, sort_keys=True) for v in present}
    out = list(present)
    for value in added:
        key = json.dumps(value, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(value)
            if len(out) > MAX_MEMBERS:
                problem = f"{name} would hold more than {MAX_MEMBERS} values"
                raise scim_error(400, problem, "invalidValue")
    return out


def _same(key: str, value: Any, wanted: Any) -> bool:
    """Whether a value's sub-attribute `key` equals the filter's value. The sub-attributes
    a filter may name are published caseExact false, but `$ref` (scim_schemas.py): their
    strings compare regardless of the case of ASCII letters, as userNames do, so
    `emails[type eq "Work"]` finds the email of type "work" (RFC 7644 s3.4.2.2)."""
    if key != "$ref" and isinstance(value, str) and isinstance(wanted, str):
        return name_key(value) == name_key(wanted)
    return bool(value == wanted)


def _apply_filtered(
    holder: dict[str, Any], op: str, name: str, path: Path, value: Any, table: dict[str, Any]
) -> None:
    elements = list(holder.get(name) or [])
    if path.match is None:
        raise scim_error(400, f"a sub-attribute of {name} needs a [filter]", "invalidPath")
    key, wanted = path.match
    hits = [
        i for i, e in enumerate(elements) if isinstance(e, dict) and _same(key, e.get(key), wanted)
    ]
    if not hits and (op == "remove" or path.sub is None):
        if op == "add" and path.sub is None:
            elements.append(value)
        else:
            raise scim_error(400, f"no value of {name} matches the filter", "noTarget")
    elif not hits:  # add or replace a sub-attribute of a value not there yet: create it
        elements.append({key: wanted, path.sub: value})
    for i in hits:
        if path.sub is None:
            elements[i] = None if op == "remove" else value
        elif op == "remove":
            elements[i] = {k: v for k, v in elements[i].items() if k != path.sub}
        else:
            elements[i] = {**elements[i], path.sub: value}
    kept = [e for e in elements if e is not None]
    holder[name] = check_attribute(name, kept, table) if kept else None
    if holder[name] is None:
        del holder[name]
