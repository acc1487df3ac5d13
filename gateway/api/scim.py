"""/scim/v2: the directory an identity provider provisions (RFC 7644), discovery and Users;
Groups are in scim_groups.py. Only a `scim` key reaches these routes, and its tenant is the
only one they read or write: another tenant's IDs are 404, as if they did not exist.

Bodies are read by the routes themselves (not by FastAPI models) so that every refusal is
a SCIM error body (scim_errors.py), never a 422 or a 500. A write that may take access
away (a user created inactive, deactivated, deleted or renamed, its externalId changed,
a userName or externalId given to a user that someone held before, members removed, a
group renamed or deleted) is answered once every replica enforces it, as an ACL change is
(docs/operations.md, "Directory (SCIM)"); a write that only adds is answered at once, so
a first sync is fast.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from gateway.api.scim_errors import SCIM_JSON
from gateway.api.scim_patch import equality, operations, patch_user
from gateway.api.scim_resources import (
    MAX_STRING,
    render_user,
    scim_error,
    user_as_document,
    user_document,
    user_fields,
)
from gateway.api.scim_schemas import (
    ENTERPRISE,
    GROUP,
    LIST,
    MAX_RESULTS,
    RESOURCE_TYPES,
    SCHEMAS,
    USER,
    service_provider_config,
)
from gateway.api.security import StateDep, scim_caller
from gateway.api.state import AppState
from gateway.domain import Caller, has_unstorable
from gateway.ingest.parse import strict_object
from gateway.jsonbody import loads
from gateway.storage.directory import Conflict, DirUser, UserFields

log = logging.getLogger("gateway.api")
REPLICAS_WAIT_S = 5.0  # as for an ACL change (gateway/api/ingest.py)
DEFAULT_COUNT = 100
DOCS = "https://github.com/ (docs/api.md, Directory (SCIM 2.0))"

ScimCaller = Annotated[Caller, Depends(scim_caller)]


def printable_ids(request: Request) -> None:
    """A resource ID that is no printable string names no resource: 404 before a database
    sees it (PostgreSQL refuses a NUL with an error of its own; SQLite a lone surrogate)."""
    for value in request.path_params.values():
        if not (isinstance(value, str) and len(value) <= MAX_STRING and value.isprintable()):
            raise scim_error(404, "no such resource")


# Both routers (scim_groups.py takes it from here) check the path's IDs first.
SCIM_ROUTES: dict[str, Any] = {
    "prefix": "/scim/v2",
    "tags": ["scim"],
    "include_in_schema": False,
    "dependencies": [Depends(printable_ids)],
}
scim = APIRouter(**SCIM_ROUTES)


def scim_json(body: dict[str, Any], status: int = 200, location: str | None = None) -> Response:
    headers = {"Location": location} if location else None
    return JSONResponse(body, status_code=status, media_type=SCIM_JSON, headers=headers)


def base_url(request: Request, state: AppState) -> str:
    root = state.settings.public_url.rstrip("/") or str(request.base_url).rstrip("/")
    return f"{root}/scim/v2"


async def body_of(request: Request) -> Any:
    body = await request.body()
    try:
        return loads(body, object_pairs_hook=strict_object)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise scim_error(400, "the body is not JSON", "invalidSyntax") from None
    except ValueError as exc:  # a key given twice (its name), or nested too deeply
        why = f"the body is not JSON the directory reads: {exc}"
        raise scim_error(400, why, "invalidSyntax") from None


Params = Mapping[str, str]
SEARCH = "urn:ietf:params:scim:api:messages:2.0:SearchRequest"


async def search_params(request: Request) -> dict[str, str]:
    """A POST .search body (RFC 7644 s3.4.3) as the query parameters a GET would carry."""
    body = await body_of(request)
    if not isinstance(body, dict) or body.get("schemas") != [SEARCH]:
        raise scim_error(400, f"a search body must have schemas [{SEARCH}]", "invalidSyntax")
    params: dict[str, str] = {}
    for key in ("filter", "startIndex", "count", "attributes", "excludedAttributes"):
        value = body.get(key)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            params[key] = str(value)
        elif value is not None:
            raise scim_error(400, f"{key} has the wrong type", "invalidValue")
    return params


def page(params: Params) -> tuple[int, int]:
    """(startIndex, count) of a list request: 1-based, count at most MAX_RESULTS."""
    try:
        start = int(params.get("startIndex", "1"))
        count = int(params.get("count", str(DEFAULT_COUNT)))
    except ValueError:
        raise scim_error(400, "startIndex and count must be integers", "invalidValue") from None
    # Past 2**31 no database offset exists (SQLite would overflow): nothing is there anyway.
    return min(max(start, 1), 2**31), min(max(count, 0), MAX_RESULTS)


def list_filter(params: Params, allowed: tuple[str, ...]) -> tuple[str, str] | None:
    text = params.get("filter")
    if text is None:
        return None
    attribute, value = equality(text)
    name = next((a for a in allowed if a.lower() == attribute.lower()), None)
    if name is None or not isinstance(value, str):
        raise scim_error(
            400, f"filters are `eq` on {', '.join(allowed)} with a string", "invalidFilter"
        )
    if len(value) > MAX_STRING or has_unstorable(value):  # as every value written is
        raise scim_error(
            400, "the filter's value must be a string without control characters", "invalidFilter"
        )
    return name, value


Selection = dict[str, "Selection | None"]  # lower-case name -> what of it; None: all of it


def _selection(names: str) -> Selection:
    """Comma-separated names in attribute notation (RFC 7644 s3.10: `name` or `name.sub`,
    after its schema's URN or not; the enterprise extension's only after its own URN) as a
    tree of lower-case names. A name of more parts names no attribute and is left out."""
    tree: Selection = {}
    extension = ENTERPRISE.lower()
    prefixes = (USER.lower() + ":", GROUP.lower() + ":")
    for raw in names.split(","):
        name = raw.strip().lower()
        for prefix in prefixes:
            name = name.removeprefix(prefix)
        if name == extension or name.startswith(f"{extension}:"):
            rest = name[len(extension) + 1 :]
            parts = [extension, *rest.split(".")] if rest else [extension]
        else:
            parts = name.split(".")
        if "" in parts or len(parts) > (3 if parts[0] == extension else 2):
            continue
        node = tree
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if child is None:  # all of it is named already
                break
            node = child
        else:
            node[parts[-1]] = None
    return tree


def _picked(value: dict[str, Any], wanted: Selection) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key.lower() not in wanted:
            continue
        subs = wanted[key.lower()]
        if subs is None:
            out[key] = item
        elif isinstance(item, dict) and (inner := _picked(item, subs)):
            out[key] = inner
        elif isinstance(item, list):
            values = [p for v in item if isinstance(v, dict) and (p := _picked(v, subs))]
            if values:
                out[key] = values
    return out


def _without(value: dict[str, Any], dropped: Selection) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key.lower() not in dropped:
            out[key] = item
            continue
        subs = dropped[key.lower()]
        if subs is None:
            continue
        if isinstance(item, dict):
            item = _without(item, subs)
        elif isinstance(item, list):
            item = [_without(v, subs) if isinstance(v, dict) else v for v in item]
            item = [v for v in item if v != {}]
        if item != {} and item != []:  # unless every sub-attribute of it was excluded
            out[key] = item
    return out


class Projection:
    """`attributes` or `excludedAttributes` of a request (RFC 7644 s3.9), read once for
    every resource of its answer: a page of 1,000 resources reads a value of a megabyte
    once, not 1,000 times. Names are compared without regard to case; a name that is no
    attribute is ignored. `id` and `schemas` are always returned (RFC 7643 s3.1 returns
    `id` "always"); `meta` is returned by default, so `attributes` without it leaves it out
    and `excludedAttributes=meta` drops it. The two parameters are mutually exclusive:
    `attributes` wins."""

    def __init__(self, params: Params) -> None:
        wanted = params.get("attributes")
        dropped = params.get("excludedAttributes")
        self.wanted = _selection(wanted) if wanted else None
        self.dropped = _selection(dropped) if dropped and not wanted else {}

    def shows(self, name: str) -> bool:
        """Whether answers show any of top-level attribute `name`."""
        lowered = name.lower()
        if self.wanted is not None:
            return lowered in self.wanted
        return lowered not in self.dropped or self.dropped[lowered] is not None

    def __call__(self, resource: dict[str, Any]) -> dict[str, Any]:
        if self.wanted is not None:
            shown = _picked(resource, self.wanted)
        elif self.dropped:
            shown = _without(resource, self.dropped)
        else:
            return resource
        return {"schemas": resource["schemas"], "id": resource["id"], **shown}


def listed(total: int, start: int, resources: list[dict[str, Any]]) -> Response:
    return scim_json(
        {
            "schemas": [LIST],
            "totalResults": total,
            "startIndex": start,
            "itemsPerPage": len(resources),
            "Resources": resources,
        }
    )


async def enforced(state: AppState, version: int) -> None:
    """Until every replica enforces the directory at `version` (with a database server)."""
    versions = state.catalog.directory_versions
    versions.forget()
    behind = await versions.everywhere(version, REPLICAS_WAIT_S)
    if behind:
        log.warning("replicas %s do not enforce directory version %d yet", behind, version)


def _located(resources: dict[str, dict[str, Any]], request: Request, state: AppState) -> Any:
    base = base_url(request, state)
    return {
        key: {**doc, "meta": {**doc["meta"], "location": base + doc["meta"]["location"]}}
        for key, doc in resources.items()
    }


@scim.get("/ServiceProviderConfig")
async def get_config(request: Request, _caller: ScimCaller, state: StateDep) -> Response:
    config = service_provider_config(DOCS)
    config["meta"]["location"] = base_url(request, state) + config["meta"]["location"]
    return scim_json(config)


@scim.get("/ResourceTypes")
async def list_resource_types(request: Request, _caller: ScimCaller, state: StateDep) -> Response:
    found = list(_located(RESOURCE_TYPES, request, state).values())
    return listed(len(found), 1, found)


@scim.get("/ResourceTypes/{type_id}")
async def get_resource_type(
    type_id: str, request: Request, _caller: ScimCaller, state: StateDep
) -> Response:
    found = _located(RESOURCE_TYPES, request, state).get(type_id)
    if found is None:
        raise scim_error(404, f"no resource type {type_id[:64]!r}")
    return scim_json(found)


@scim.get("/Schemas")
async def list_schemas(request: Request, _caller: ScimCaller, state: StateDep) -> Response:
    found = list(_located(SCHEMAS, request, state).values())
    return listed(len(found), 1, found)


@scim.get("/Schemas/{schema_id}")
async def get_schema(
    schema_id: str, request: Request, _caller: ScimCaller, state: StateDep
) -> Response:
    found = _located(SCHEMAS, request, state).get(schema_id)
    if found is None:
        raise scim_error(404, f"no schema {schema_id[:128]!r}")
    return scim_json(found)


@scim.post("/.search")
async def search_everything(_caller: ScimCaller) -> Response:
    raise scim_error(501, "search /Users/.search or /Groups/.search, one type at a time")


@scim.get("/Users")
async def list_users(request: Request, caller: ScimCaller, state: StateDep) -> Response:
    return await _users(request, caller, state, request.query_params)


@scim.post("/Users/.search")
async def search_users(request: Request, caller: ScimCaller, state: StateDep) -> Response:
    return await _users(request, caller, state, await search_params(request))


async def _users(request: Request, caller: Caller, state: AppState, params: Params) -> Response:
    where = list_filter(params, ("userName", "externalId"))
    start, count = page(params)
    total, users = await asyncio.to_thread(
        state.catalog.directory.users, caller.tenant, where, start - 1, count
    )
    base = base_url(request, state)
    shown = Projection(params)
    return listed(total, start, [shown(render_user(u, base)) for u in users])


@scim.post("/Users")
async def create_user(request: Request, caller: ScimCaller, state: StateDep) -> Response:
    fields = user_fields(user_document(await body_of(request)))
    try:
        user, created = await asyncio.to_thread(
            state.catalog.directory.create_user, caller.tenant, fields
        )
    except Conflict:
        raise scim_error(409, "a user with this userName exists", "uniqueness") from None
    # Created inactive, a token naming it becomes refused; given a name or externalId that
    # someone held before, the former holder's tokens (gateway/storage/directory.py, since).
    if not user.fields.active or user.since != (None, None):
        await enforced(state, created)
    else:
        state.catalog.directory_versions.forget()
    rendered = render_user(user, base_url(request, state))
    shown = Projection(request.query_params)
    return scim_json(shown(rendered), 201, rendered["meta"]["location"])


async def _user(state: AppState, tenant: str, user_id: str) -> DirUser:
    found = await asyncio.to_thread(state.catalog.directory.user, tenant, user_id)
    if found is None:
        raise scim_error(404, "no such user")
    return found


@scim.get("/Users/{user_id}")
async def get_user(user_id: str, request: Request, caller: ScimCaller, state: StateDep) -> Response:
    user = await _user(state, caller.tenant, user_id)
    rendered = render_user(user, base_url(request, state))
    return scim_json(Projection(request.query_params)(rendered))


async def _replace(
    state: AppState,
    caller: Caller,
    user_id: str,
    change: Callable[[DirUser], dict[str, Any]],
    request: Request,
) -> Response:
    """Write the document `change` makes of the user as the write transaction reads it
    (gateway/storage/directory.py, `update_user`): concurrent writes never undo each other."""

    def fields_of(old: DirUser) -> UserFields:
        return user_fields(change(old), old.fields.active)

    try:
        old, user, version = await asyncio.to_thread(
            state.catalog.directory.update_user, caller.tenant, user_id, fields_of
        )
    except Conflict:
        raise scim_error(409, "a user with this userName exists", "uniqueness") from None
    if old is None or user is None:
        raise scim_error(404, "no such user")
    renamed = old.fields.user_name != user.fields.user_name
    # With `user_attribute: externalId`, the former value's tokens lose the user's groups.
    moved = old.fields.external_id != user.fields.external_id
    if old.fields.active and not user.fields.active or renamed or moved:
        await enforced(state, version)  # deprovisioned, or another person now
    else:
        state.catalog.directory_versions.forget()
    rendered = render_user(user, base_url(request, state))
    return scim_json(Projection(request.query_params)(rendered))


@scim.put("/Users/{user_id}")
async def replace_user(
    user_id: str, request: Request, caller: ScimCaller, state: StateDep
) -> Response:
    doc = user_document(await body_of(request))
    return await _replace(state, caller, user_id, lambda _old: doc, request)


@scim.patch("/Users/{user_id}")
async def patch_user_route(
    user_id: str, request: Request, caller: ScimCaller, state: StateDep
) -> Response:
    ops = operations(await body_of(request))

    def patched(old: DirUser) -> dict[str, Any]:
        return user_document({"schemas": [USER], **patch_user(user_as_document(old), ops)})

    return await _replace(state, caller, user_id, patched, request)


@scim.delete("/Users/{user_id}")
async def delete_user(user_id: str, caller: ScimCaller, state: StateDep) -> Response:
    gone, version = await asyncio.to_thread(
        state.catalog.directory.delete_user, caller.tenant, user_id
    )
    if not gone:
        raise scim_error(404, "no such user")
    await enforced(state, version)
    return Response(status_code=204)
