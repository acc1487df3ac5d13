"""One error type with a code table; the API renders it as application/problem+json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# Every code a problem body can carry. A Literal, so that mypy refuses a misspelt code where
# it is written instead of the request failing with a 500 where it is raised.
ErrorCode = Literal[
    "unauthenticated",
    "insufficient_claims",
    "forbidden",
    "not_found",
    "policy_refused",
    "validation_error",
    "lanes_unavailable",
    "not_ready",
    "internal_error",
    "invalid_document",
    "invalid_policy",
    "index_mismatch",
    "index_invalid",
    "body_too_large",
    "unsupported_media_type",
    "catalog_outdated",
    "tenant_mismatch",
    "not_owner",
    "outside_doc_prefix",
    "ingest_backlog",
    "catalog_unavailable",
    "rate_limited",
    "audit_unavailable",
    "llm_busy",
    "preview_too_large",
    "preview_busy",
    "preview_timeout",
    "account_disabled",
    "scim_error",
]
# The code of an HTTP-level refusal made before any route runs (method not allowed, a body
# that is not UTF-8, a request head over its bound): its status is the HTTP one.
ProblemCode = ErrorCode | Literal["http_error"]

# Codes of a service away for a moment (the catalog's database, the object store): a caller
# waits and tries again, and nothing is recorded as the fault of the request or the job.
TRANSIENT_CODES: frozenset[ErrorCode] = frozenset({"catalog_unavailable", "not_ready"})

# code -> (HTTP status, title). Titles are fixed text: details never echo secrets or content.
ERROR_CODES: dict[ErrorCode, tuple[int, str]] = {
    "unauthenticated": (401, "Authentication required"),
    "insufficient_claims": (403, "Token lacks required claims"),
    "forbidden": (403, "Forbidden"),
    "not_found": (404, "Not found"),
    "policy_refused": (409, "Policy refused; the previous policy keeps serving"),
    "validation_error": (422, "Request validation failed"),
    "lanes_unavailable": (503, "No retrieval lane answered in time"),
    "not_ready": (503, "Service not ready"),
    "internal_error": (500, "Internal error"),
    # ingest / CLI side
    "invalid_document": (400, "Invalid document"),
    "invalid_policy": (422, "Invalid policy"),
    "index_mismatch": (500, "Index does not match the configured model"),
    "index_invalid": (500, "An index generation in the object store is not valid"),
    "body_too_large": (413, "Request body too large"),
    "unsupported_media_type": (415, "Unsupported media type or content coding"),
    "catalog_outdated": (500, "The catalog predates this release"),
    "tenant_mismatch": (403, "A document names another tenant"),
    "not_owner": (403, "The document was not pushed by this key"),
    "outside_doc_prefix": (403, "A document is outside the key's doc_id prefix"),
    "ingest_backlog": (429, "Too many ingest jobs waiting; retry later"),
    "catalog_unavailable": (503, "The catalog database is unavailable"),
    "rate_limited": (429, "Too many requests"),
    "audit_unavailable": (503, "The audit trail cannot be written"),
    "llm_busy": (503, "Too many answers in progress; retry shortly"),
    "preview_too_large": (422, "The edited policy is over the preview's bounds"),
    "preview_busy": (429, "Too many policy previews in progress; retry shortly"),
    "preview_timeout": (503, "The policy preview ran past its time limit"),
    "account_disabled": (403, "The account is disabled in the directory"),
    # /scim/v2 answers with SCIM's own error body (RFC 7644 s3.12) and the status it names;
    # this code is the rare one whose status is carried in `extra["scim_status"]`.
    "scim_error": (400, "SCIM request refused"),
}


@dataclass
class GatewayError(Exception):
    """An expected failure, identified by a code from ERROR_CODES."""

    code: ErrorCode
    detail: str = ""
    extra: dict[str, Any] | None = None
    headers: dict[str, str] | None = None  # e.g. Retry-After beside a 429

    def __post_init__(self) -> None:
        if self.code not in ERROR_CODES:
            raise ValueError(f"unknown error code {self.code!r}")
        super().__init__(f"{self.code}: {self.detail}" if self.detail else self.code)

    @property
    def status(self) -> int:
        return ERROR_CODES[self.code][0]

    @property
    def title(self) -> str:
        return ERROR_CODES[self.code][1]

    @property
    def transient(self) -> bool:
        """Whether a service was away for a moment (`TRANSIENT_CODES`): worth a retry."""
        return self.code in TRANSIENT_CODES

    def problem(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": f"urn:gateway:error:{self.code}",
            "title": self.title,
            "status": self.status,
            "code": self.code,
        }
        if self.detail:
            body["detail"] = self.detail
        if self.extra:
            body.update(self.extra)
        return body
