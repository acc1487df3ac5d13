"""/scim/v2/Groups: groups whose members hold `group:<displayName>` (gateway/authn/directory.py).

Members are users of the same tenant, by ID; a request names at most
scim_schemas.MAX_MEMBERS of them (identity providers send memberships in batches), and one
naming an unknown user, a group, or more than that is refused whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.scim import (
    SCIM_ROUTES,
    Params,
    Projection,
    ScimCaller,
    base_url,
    body_of,
    enforced,
    list_filter,
    listed,
    page,
    scim_json,
    search_params,
)
from gateway.api.scim_patch import equality, operations
from gateway.api.scim_resources import (
    READ_ONLY,
    group_document,
    indexed_string,
    member_ids,
    render_group,
    scim_error,
)
from gateway.api.scim_schemas import MAX_MEMBERS
from gateway.api.security import StateDep
from gateway.api.state import AppState
from gateway.domain import Caller
from gateway.storage.directory import DirGroup, GroupChange, UnknownMembers

GROUP_URN = "urn:ietf:params:scim:schemas:core:2.0:group:"  # a path's prefix, lower case
groups = APIRouter(**SCIM_ROUTES)


@groups.get("/Groups")
async def list_groups(request: Request, caller: ScimCaller, state: StateDep) -> Response:
    return await _groups(request, caller, state, request.query_params)


@groups.post("/Groups/.search")
async def search_groups(request: Request, caller: ScimCaller, state: StateDep) -> Response:
    return await _groups(request, caller, state, await search_params(request))


async def _groups(request: Request, caller: Caller, state: AppState, params: Params) -> Response:
    where = list_filter(params, ("displayName", "externalId"))
    start, count = page(params)
    shown = Projection(params)
    # Entra ID reads groups without their members: a group of many thousand users then
    # costs no member look-up.
    total, found = await asyncio.to_thread(
        state.catalog.directory.groups,
        caller.tenant,
        where,
        start - 1,
        count,
        shown.shows("members"),
    )
    base = base_url(request, state)
    return listed(total, start, [shown(render_group(g, base)) for g in found])


@groups.post("/Groups")
async def create_group(request: Request, caller: ScimCaller, state: StateDep) -> Response:
    doc = group_document(await body_of(request))
    try:
        group, _ = await asyncio.to_thread(
            state.catalog.directory.create_group,
            caller.tenant,
            doc["displayName"],
            doc.get("externalId"),
            doc["members"],
        )
    except UnknownMembers as exc:
        raise _unknown(exc) from None
    state.catalog.directory_versions.forget()
    rendered = render_group(group, base_url(request, state))
    shown = Projection(request.query_params)
    return scim_json(shown(rendered), 201, rendered["meta"]["location"])


async def _group(state: AppState, tenant: str, group_id: str, members: bool = True) -> DirGroup:
    found = await asyncio.to_thread(state.catalog.directory.group, tenant, group_id, members)
    if found is None:
        raise scim_error(404, "no such group")
    return found


@groups.get("/Groups/{group_id}")
async def get_group(
    group_id: str, request: Request, caller: ScimCaller, state: StateDep
) -> Response:
    shown = Projection(request.query_params)
    group = await _group(state, caller.tenant, group_id, shown.shows("members"))
    return scim_json(shown(render_group(group, base_url(request, state))))


@groups.put("/Groups/{group_id}")
async def replace_group(
    group_id: str, request: Request, caller: ScimCaller, state: StateDep
) -> Response:
    doc = group_document(await body_of(request))
    return await _change(state, caller, group_id, lambda _old: doc, request)


@groups.patch("/Groups/{group_id}")
async def patch_group(
    group_id: str, request: Request, caller: ScimCaller, state: StateDep
) -> Response:
    ops = operations(await body_of(request))
    named = sum(_named_members(path, value) for _, path, value in ops)
    if named > MAX_MEMBERS:
        raise scim_error(
            400,
            f"the operations name {named} values; at most {MAX_MEMBERS} per request "
            "(send more in further PATCH requests); nothing was changed",
            "invalidValue",
        )

    def patched(old: DirGroup) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "displayName": old.display_name,
            "members": [u for u, _ in old.members],
        }
        if old.external_id is not None:
            doc["externalId"] = old.external_id
        for op, path, value in ops:
            _apply(doc, op, path, value)
        return doc

    return await _change(state, caller, group_id, patched, request)


def _named_members(path: str | None, value: Any) -> int:
    """How many members one operation names, with a path or without one (a value of
    {"members": [...]}), so that no spelling of a request escapes MAX_MEMBERS."""
    if path is None:
        if not isinstance(value, dict):
            return 0
        return sum(_named_members(key, item) for key, item in value.items())
    name = path.partition("[")[0].strip().lower()
    if name.removeprefix(GROUP_URN) != "members":
        return 0
    return len(value) if isinstance(value, list) else int(value is not None)


def _apply(doc: dict[str, Any], op: str, path: str | None, value: Any) -> None:
    if path is None:
        if op == "remove" or not isinstance(value, dict):
            raise scim_error(400, f"{op} without a path needs an object value", "noTarget")
        for key, item in value.items():
            if key.lower() not in READ_ONLY:
                _apply(doc, op, key, item)
        return
    name, _, condition = path.partition("[")
    name = name.strip().lower().removeprefix(GROUP_URN)
    if name == "members":
        _members(doc, op, condition, value)
    elif name in ("displayname", "externalid") and not condition:
        key = "displayName" if name == "displayname" else "externalId"
        if op == "remove" and key == "displayName":
            raise scim_error(400, "displayName is required", "mutability")
        if op == "remove":
            doc.pop(key, None)
        else:
            doc[key] = indexed_string(value, key)  # the rules and bounds of a POST or a PUT
    else:
        raise scim_error(400, f"path {path[:128]!r} names no attribute of Group", "invalidPath")


def _members(doc: dict[str, Any], op: str, condition: str, value: Any) -> None:
    present: list[str] = doc["members"]
    if condition:  # members[value eq "id"]
        if not condition.endswith("]") or op != "remove":
            raise scim_error(400, "a members filter is for remove only", "invalidPath")
        attribute, wanted = equality(condition[:-1])
        if attribute.lower() != "value" or not isinstance(wanted, str):
            raise scim_error(400, "members are filtered by value", "invalidFilter")
        if wanted not in present:
            raise scim_error(400, "no member matches the filter", "noTarget")
        doc["members"] = [u for u in present if u != wanted]
    elif op == "remove" and value is None:
        doc["members"] = []
    elif op == "remove":
        gone = set(member_ids(value))
        doc["members"] = [u for u in present if u not in gone]
    elif op == "add":
        there = set(present)  # once: a set per member made a large group's add quadratic
        doc["members"] = present + [u for u in member_ids(value) if u not in there]
    else:
        doc["members"] = member_ids(value or [])


async def _change(
    state: AppState,
    caller: Caller,
    group_id: str,
    change: Callable[[DirGroup], dict[str, Any]],
    request: Request,
) -> Response:
    """Write the group `change` makes of the group as the write transaction reads it
    (gateway/storage/directory.py, `update_group`): members removed are computed from the
    members then, not from an earlier read that a concurrent request may have changed."""

    def wanted(old: DirGroup) -> GroupChange:
        doc = change(old)
        return doc["displayName"], doc.get("externalId"), list(doc["members"])

    try:
        old, group, version = await asyncio.to_thread(
            state.catalog.directory.update_group, caller.tenant, group_id, wanted
        )
    except UnknownMembers as exc:
        raise _unknown(exc) from None
    if old is None or group is None:
        raise scim_error(404, "no such group")
    before = {u for u, _ in old.members}
    after = {u for u, _ in group.members}
    if before - after or old.display_name != group.display_name:
        await enforced(state, version)  # someone loses the group's access
    else:
        state.catalog.directory_versions.forget()
    # A client that sends `excludedAttributes=members` gets no copy of a large group's
    # members after each change (RFC 7644 s3.5.2 applies the parameters to PATCH too).
    shown = Projection(request.query_params)
    return scim_json(shown(render_group(group, base_url(request, state))))


@groups.delete("/Groups/{group_id}")
async def delete_group(group_id: str, caller: ScimCaller, state: StateDep) -> Response:
    gone, version = await asyncio.to_thread(
        state.catalog.directory.delete_group, caller.tenant, group_id
    )
    if not gone:
        raise scim_error(404, "no such group")
    await enforced(state, version)
    return Response(status_code=204)


def _unknown(exc: UnknownMembers) -> Exception:
    shown = ", ".join(i[:64] for i in exc.ids[:5])
    more = f" and {len(exc.ids) - 5} more" if len(exc.ids) > 5 else ""
    return scim_error(
        400,
        f"members name no user of this tenant: {shown}{more}; nothing was changed",
        "invalidValue",
    )
