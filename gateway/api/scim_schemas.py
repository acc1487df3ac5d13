"""What /scim/v2 publishes about itself (RFC 7643 s5-s7): the service provider's
configuration, its resource types, and the schemas of User (with the enterprise
extension) and Group, built from one compact table so that what is published is exactly
what the routes accept (any other attribute is refused, docs/api.md, "Directory (SCIM 2.0)").
"""

from __future__ import annotations

from typing import Any

USER = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
ENTERPRISE = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
LIST = "urn:ietf:params:scim:api:messages:2.0:ListResponse"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
ERROR = "urn:ietf:params:scim:api:messages:2.0:Error"
SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:Schema"
RESOURCE_TYPE = "urn:ietf:params:scim:schemas:core:2.0:ResourceType"
CONFIG = "urn:ietf:params:scim:schemas:core:2.0:ServiceProviderConfig"
MAX_RESULTS = 1000  # a page holds at most this many resources
MAX_MEMBERS = 1000  # member values one request may carry (PATCH, POST or PUT)
MAX_OPERATIONS = 100  # operations in one PATCH

# name: (type, multiValued, mutability, sub-attributes). Sub-attributes are name: type
# (readWrite) or name: (type, mutability). An attribute is caseExact false, returned
# default, uniqueness none, required false, unless `_SPECIAL` says otherwise.
_Sub = dict[str, Any]
_MULTI: _Sub = {"value": "string", "display": "string", "type": "string", "primary": "boolean"}
_USER: dict[str, tuple[str, bool, str, _Sub]] = {
    "userName": ("string", False, "readWrite", {}),
    "name": (
        "complex",
        False,
        "readWrite",
        {
            "formatted": "string",
            "familyName": "string",
            "givenName": "string",
            "middleName": "string",
            "honorificPrefix": "string",
            "honorificSuffix": "string",
        },
    ),
    "displayName": ("string", False, "readWrite", {}),
    "nickName": ("string", False, "readWrite", {}),
    "profileUrl": ("reference", False, "readWrite", {}),
    "title": ("string", False, "readWrite", {}),
    "userType": ("string", False, "readWrite", {}),
    "preferredLanguage": ("string", False, "readWrite", {}),
    "locale": ("string", False, "readWrite", {}),
    "timezone": ("string", False, "readWrite", {}),
    "active": ("boolean", False, "readWrite", {}),
    # Accepted (Okta sends it when it syncs passwords) and never kept nor returned: nobody
    # signs in to the gateway with a password.
    "password": ("string", False, "writeOnly", {}),
    "emails": ("complex", True, "readWrite", _MULTI),
    "phoneNumbers": ("complex", True, "readWrite", _MULTI),
    "ims": ("complex", True, "readWrite", _MULTI),
    "photos": ("complex", True, "readWrite", {**_MULTI, "value": "reference"}),
    "addresses": (
        "complex",
        True,
        "readWrite",
        {
            "formatted": "string",
            "streetAddress": "string",
            "locality": "string",
            "region": "string",
            "postalCode": "string",
            "country": "string",
            "type": "string",
            "primary": "boolean",
        },
    ),
    "groups": (
        "complex",
        True,
        "readOnly",
        {
            "value": ("string", "readOnly"),
            "$ref": ("reference", "readOnly"),
            "display": ("string", "readOnly"),
            "type": ("string", "readOnly"),
        },
    ),
    "entitlements": ("complex", True, "readWrite", _MULTI),
    "roles": ("complex", True, "readWrite", _MULTI),
    "x509Certificates": ("complex", True, "readWrite", {**_MULTI, "value": "binary"}),
}
_ENTERPRISE: dict[str, tuple[str, bool, str, _Sub]] = {
    "employeeNumber": ("string", False, "readWrite", {}),
    "costCenter": ("string", False, "readWrite", {}),
    "organization": ("string", False, "readWrite", {}),
    "division": ("string", False, "readWrite", {}),
    "department": ("string", False, "readWrite", {}),
    "manager": (
        "complex",
        False,
        "readWrite",
        {
            "value": "string",
            "$ref": "reference",
            "displayName": ("string", "readOnly"),
        },
    ),
}
_GROUP: dict[str, tuple[str, bool, str, _Sub]] = {
    "displayName": ("string", False, "readWrite", {}),
    "members": (
        "complex",
        True,
        "readWrite",
        # `type` and `display` are accepted but not published: a member is always a User,
        # and the display name is the user's own (docs/api.md, "Directory (SCIM 2.0)").
        {"value": ("string", "immutable"), "$ref": ("reference", "immutable")},
    ),
}
_REQUIRED = {("user", "userName"), ("group", "displayName")}  # top-level only
_EXACT = {("group", "displayName")}  # caseExact true, besides members' and $ref
_REFERENCES = {
    "profileUrl": ["external"],
    "photos.value": ["external"],
    "groups.$ref": ["User", "Group"],
    "members.$ref": ["User"],
    "manager.$ref": ["User"],
}

# The attributes each schema accepts, for the routes: name -> (type, multiValued, subs).
USER_ATTRIBUTES = _USER
ENTERPRISE_ATTRIBUTES = _ENTERPRISE
GROUP_ATTRIBUTES = _GROUP


def _spec(spec: Any) -> tuple[str, bool, str, _Sub]:
    if isinstance(spec, str):
        return spec, False, "readWrite", {}
    if len(spec) == 2:
        return spec[0], False, spec[1], {}
    kind, multi, mutability, subs = spec
    return kind, multi, mutability, subs


def _attribute(name: str, spec: Any, owner: str, parent: str = "") -> dict[str, Any]:
    kind, multi, mutability, subs = _spec(spec)
    path = f"{parent}.{name}" if parent else name
    out: dict[str, Any] = {
        "name": name,
        "type": kind,
        "multiValued": multi,
        "description": path,
        "required": not parent and (owner, name) in _REQUIRED,
        # A group's displayName is its principal, `group:<displayName>`, compared exactly
        # wherever access is decided (and "Finance" and "finance" may be two groups).
        "caseExact": parent == "members" or name == "$ref" or (owner, path) in _EXACT,
        "mutability": mutability,
        "returned": "never" if mutability == "writeOnly" else "default",
        "uniqueness": "server" if name == "userName" else "none",
    }
    if path in _REFERENCES or kind == "reference":
        out["referenceTypes"] = _REFERENCES.get(path, ["external"])
    if subs:
        out["subAttributes"] = [_attribute(n, s, owner, name) for n, s in subs.items()]
    return out


def _schema(schema_id: str, name: str, table: dict[str, Any], owner: str) -> dict[str, Any]:
    return {
        "schemas": [SCHEMA],
        "id": schema_id,
        "name": name,
        "description": f"{name} as this gateway stores it",
        "attributes": [_attribute(n, s, owner) for n, s in table.items()],
        "meta": {"resourceType": "Schema", "location": f"/Schemas/{schema_id}"},
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    USER: _schema(USER, "User", _USER, "user"),
    ENTERPRISE: _schema(ENTERPRISE, "EnterpriseUser", _ENTERPRISE, "user"),
    GROUP: _schema(GROUP, "Group", _GROUP, "group"),
}

RESOURCE_TYPES: dict[str, dict[str, Any]] = {
    "User": {
        "schemas": [RESOURCE_TYPE],
        "id": "User",
        "name": "User",
        "endpoint": "/Users",
        "description": "A person the identity provider provisions",
        "schema": USER,
        "schemaExtensions": [{"schema": ENTERPRISE, "required": False}],
        "meta": {"resourceType": "ResourceType", "location": "/ResourceTypes/User"},
    },
    "Group": {
        "schemas": [RESOURCE_TYPE],
        "id": "Group",
        "name": "Group",
        "endpoint": "/Groups",
        "description": "A group of users; its members hold group:<displayName>",
        "schema": GROUP,
        "schemaExtensions": [],
        "meta": {"resourceType": "ResourceType", "location": "/ResourceTypes/Group"},
    },
}


def service_provider_config(docs: str) -> dict[str, Any]:
    return {
        "schemas": [CONFIG],
        "documentationUri": docs,
        "patch": {"supported": True},
        "bulk": {"supported": False, "maxOperations": 0, "maxPayloadSize": 0},
        "filter": {"supported": True, "maxResults": MAX_RESULTS},
        "changePassword": {"supported": False},
        "sort": {"supported": False},
        "etag": {"supported": False},
        "authenticationSchemes": [
            {
                "type": "oauthbearertoken",
                "name": "Bearer key",
                "description": "A key made by `gateway keys create --tenant T --scope scim`",
                "primary": True,
            }
        ],
        "meta": {"resourceType": "ServiceProviderConfig", "location": "/ServiceProviderConfig"},
    }
