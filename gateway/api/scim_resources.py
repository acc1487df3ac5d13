"""SCIM resources in and out: a request body checked against the published schemas
(scim_schemas.py) into what the directory stores, and a stored user or group rendered
back, with errors as RFC 7644 s3.12 describes them (`ScimError`).

Attribute names are matched without regard to case, as RFC 7643 s2.1 asks, and written
back in their canonical case. An attribute the schemas do not publish is refused
(400 invalidSyntax), never stored and never ignored; a read-only one (`id`, `meta`,
`groups`) is ignored, as RFC 7644 s3.3 allows.
"""

from __future__ import annotations

from typing import Any

from gateway.api.scim_schemas import (
    ENTERPRISE,
    ENTERPRISE_ATTRIBUTES,
    GROUP,
    MAX_MEMBERS,
    USER,
    USER_ATTRIBUTES,
)
from gateway.domain import canonical_name, has_unstorable, name_problem
from gateway.errors import GatewayError
from gateway.storage.directory import DirGroup, DirUser, UserFields

READ_ONLY = {"id", "meta", "groups", "schemas"}
MAX_STRING = 4096  # characters in one value: a name or an address, never a document
# UTF-8 bytes of a value the directory indexes (userName, externalId, a group's displayName):
# PostgreSQL refuses a B-tree entry over 2,704 bytes, which 4,096 characters can exceed.
MAX_INDEXED_BYTES = 2000


def scim_error(status: int, detail: str, scim_type: str | None = None) -> GatewayError:
    """A refusal that /scim/v2 renders as a SCIM error body with this status."""
    extra: dict[str, Any] = {"scim_status": status}
    if scim_type is not None:
        extra["scimType"] = scim_type
    return GatewayError("scim_error", detail, extra=extra)


def canonical(name: str, table: dict[str, Any]) -> str | None:
    lowered = name.lower()
    return next((known for known in table if known.lower() == lowered), None)


def _string(value: Any, where: str) -> str:
    """A string of text: format characters (a ZWNJ in a Persian name) and no-break spaces
    are text; control characters and lone surrogates are not."""
    if not isinstance(value, str) or len(value) > MAX_STRING:
        raise scim_error(
            400, f"{where} must be a string of at most {MAX_STRING} characters", "invalidValue"
        )
    if has_unstorable(value):
        problem = f"{where} contains a control character or a lone surrogate"
        raise scim_error(400, problem, "invalidValue")
    return value


def indexed_string(value: Any, where: str) -> str:
    """A name the directory compares (userName, externalId, a group's displayName): by the
    rule of every name (gateway/domain.py, `name_problem`: "jose " would be another user
    than "jose", and match no token), in NFC (`canonical_name`: "José" however its accent
    is sent), and short enough for the directory's indexes on every supported database."""
    checked = _string(value, where)
    problem = name_problem(checked)
    if problem is not None:
        raise scim_error(400, f"{where} {problem}", "invalidValue")
    checked = canonical_name(checked)
    if len(checked.encode()) > MAX_INDEXED_BYTES:
        problem = f"{where} is over {MAX_INDEXED_BYTES} bytes in UTF-8"
        raise scim_error(400, problem, "invalidValue")
    return checked


def _boolean(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"  # Entra ID sends "False" for active
    raise scim_error(400, f"{where} must be a boolean", "invalidValue")


def _simple(kind: str, value: Any, where: str) -> Any:
    return _boolean(value, where) if kind == "boolean" else _string(value, where)


def _complex(value: Any, subs: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise scim_error(400, f"{where} must be an object", "invalidValue")
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = canonical(key, subs)
        if name is None:
            raise scim_error(400, f"{where}.{key} is not an attribute", "invalidSyntax")
        spec = subs[name]
        kind = spec if isinstance(spec, str) else spec[0]
        if item is not None:
            out[name] = _simple(kind, item, f"{where}.{name}")
    return out


def check_attribute(name: str, value: Any, table: dict[str, Any]) -> Any:
    """`value` checked against attribute `name` of `table`; None removes it."""
    kind, multi, _, subs = table[name]
    if value is None:
        return None
    if multi:
        values = value if isinstance(value, list) else [value]
        if len(values) > MAX_MEMBERS:
            raise scim_error(400, f"{name} holds more than {MAX_MEMBERS} values", "invalidValue")
        return [_complex(v, subs, name) if subs else _simple(kind, v, name) for v in values]
    if subs and "value" in subs and isinstance(value, str):
        value = {"value": value}  # Entra ID sends the manager's ID alone
    return _complex(value, subs, name) if subs else _simple(kind, value, name)


def user_document(body: Any) -> dict[str, Any]:
    """A User body as a document of canonical attributes (the enterprise extension under
    its URN); 400 for anything the schemas do not publish."""
    if not isinstance(body, dict):
        raise scim_error(400, "the body must be a JSON object", "invalidSyntax")
    schemas = body.get("schemas")
    if not isinstance(schemas, list) or USER not in schemas:
        raise scim_error(400, f"schemas must name {USER}", "invalidSyntax")
    if any(s not in (USER, ENTERPRISE) for s in schemas):
        problem = "schemas names a schema this server does not publish"
        raise scim_error(400, problem, "invalidSyntax")
    doc: dict[str, Any] = {}
    for key, value in body.items():
        if key.lower() in READ_ONLY:
            continue
        if key.lower() == "externalid":
            if value is not None:
                doc["externalId"] = indexed_string(value, "externalId")
        elif key.lower() == ENTERPRISE.lower():
            extension = _extension(value)
            if extension:
                doc[ENTERPRISE] = extension
        elif (name := canonical(key, USER_ATTRIBUTES)) is not None:
            checked = check_attribute(name, value, USER_ATTRIBUTES)
            if checked is not None and name == "userName":
                checked = indexed_string(checked, name)
            if checked is not None and name != "password":  # checked, then forgotten
                doc[name] = checked
        else:
            raise scim_error(400, f"{key!r} is not an attribute of User", "invalidSyntax")
    return doc


def _extension(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise scim_error(400, f"{ENTERPRISE} must be an object", "invalidValue")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key.lower() in READ_ONLY:
            continue
        name = canonical(key, ENTERPRISE_ATTRIBUTES)
        if name is None:
            raise scim_error(400, f"{key!r} is not an attribute of {ENTERPRISE}", "invalidSyntax")
        checked = check_attribute(name, item, ENTERPRISE_ATTRIBUTES)
        if checked is not None:
            out[name] = checked
    return out


def user_fields(doc: dict[str, Any], stored_active: bool = True) -> UserFields:
    """What the directory stores of a checked document; userName is required. A document
    without `active` (never sent, removed by a PATCH, or null) keeps `stored_active`: the
    user's current state on a replace, active on a create. Only `active: true` turns a
    deactivated user active again (docs/api.md, "Directory (SCIM 2.0)")."""
    rest = dict(doc)
    user_name = rest.pop("userName", None)
    if not isinstance(user_name, str) or not user_name.strip():
        raise scim_error(400, "userName is required", "invalidValue")
    if ENTERPRISE in rest:
        rest[ENTERPRISE] = _extension(rest[ENTERPRISE])  # a PATCH may have written into it
        if not rest[ENTERPRISE]:
            del rest[ENTERPRISE]
    # `active` stays among the attributes as sent (absent when never set, RFC 7643 s4.1.1
    # makes it optional); the column holds what identity decides by: absent keeps it.
    return UserFields(
        user_name=user_name,
        external_id=rest.pop("externalId", None),
        display_name=rest.pop("displayName", None),
        active=stored_active if rest.get("active") is None else rest["active"] is not False,
        attributes=rest,
    )


def user_as_document(user: DirUser) -> dict[str, Any]:
    f = user.fields
    # `active` as the identity provider last set it: absent once removed. Identity reads
    # the column, which a removal leaves as it was, so a removed `active` never reactivates.
    doc: dict[str, Any] = {"userName": f.user_name, **f.attributes}
    if f.external_id is not None:
        doc["externalId"] = f.external_id
    if f.display_name is not None:
        doc["displayName"] = f.display_name
    return doc


def render_user(user: DirUser, base: str) -> dict[str, Any]:
    doc = user_as_document(user)
    out: dict[str, Any] = {
        "schemas": [USER, ENTERPRISE] if ENTERPRISE in doc else [USER],
        "id": user.id,
        **doc,
    }
    if user.groups:
        out["groups"] = [
            {"value": gid, "$ref": f"{base}/Groups/{gid}", "display": name, "type": "direct"}
            for gid, name in user.groups
        ]
    out["meta"] = _meta("User", f"{base}/Users/{user.id}", user)
    return out


def render_group(group: DirGroup, base: str, members: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"schemas": [GROUP], "id": group.id, "displayName": group.display_name}
    if group.external_id is not None:
        out["externalId"] = group.external_id
    if members and group.members:
        # `display` and `type` are left out: a client comparing the members it wrote with
        # those it reads back would see values it never sent.
        out["members"] = [{"value": uid, "$ref": f"{base}/Users/{uid}"} for uid, _ in group.members]
    out["meta"] = _meta("Group", f"{base}/Groups/{group.id}", group)
    return out


def _meta(kind: str, location: str, resource: DirUser | DirGroup) -> dict[str, Any]:
    return {
        "resourceType": kind,
        "created": resource.created.isoformat(),
        "lastModified": resource.modified.isoformat(),
        "location": location,
        "version": f'W/"{resource.revision}"',
    }


def member_ids(value: Any, where: str = "members") -> list[str]:
    """The user IDs a `members` value names; groups in groups are not supported."""
    values = value if isinstance(value, list) else [value]
    if len(values) > MAX_MEMBERS:
        raise scim_error(
            400,
            f"{where} names {len(values)} members; at most {MAX_MEMBERS} per request "
            "(send more in further PATCH requests); nothing was changed",
            "invalidValue",
        )
    ids = []
    for item in values:
        if not isinstance(item, dict) or not isinstance(item.get("value"), str):
            raise scim_error(400, f"each of {where} must be an object with a value", "invalidValue")
        kind = item.get("type")
        if kind is not None and (not isinstance(kind, str) or kind.lower() != "user"):
            problem = "a member must be a User: groups in groups are not supported"
            raise scim_error(400, problem, "invalidValue")
        ids.append(_string(item["value"], f"{where}.value"))
    return ids


def group_document(body: Any) -> dict[str, Any]:
    """A Group body as {displayName, externalId?, members: [user id]}."""
    if not isinstance(body, dict):
        raise scim_error(400, "the body must be a JSON object", "invalidSyntax")
    schemas = body.get("schemas")
    if not isinstance(schemas, list) or schemas != [GROUP]:
        raise scim_error(400, f"schemas must be [{GROUP}]", "invalidSyntax")
    doc: dict[str, Any] = {"members": []}
    for key, value in body.items():
        lowered = key.lower()
        if lowered in READ_ONLY:
            continue
        if lowered == "displayname":
            doc["displayName"] = indexed_string(value, "displayName")
        elif lowered == "externalid":
            if value is not None:
                doc["externalId"] = indexed_string(value, "externalId")
        elif lowered == "members":
            doc["members"] = member_ids(value or [])
        else:
            raise scim_error(400, f"{key!r} is not an attribute of Group", "invalidSyntax")
    if not str(doc.get("displayName", "")).strip():
        raise scim_error(400, "displayName is required", "invalidValue")
    return doc
