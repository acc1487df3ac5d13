"""Request and response bodies of the public HTTP contract."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    WithJsonSchema,
)

from gateway.domain import canonical_name, principal_problem

MAX_QUERY_CHARS = 2000
MAX_BATCH_DOCUMENTS = 1000  # documents in one POST /admin/documents


def _a_json_number(value: Any) -> Any:
    # JSON Schema's integer admits 4.0 (so does pydantic), but not "4" or true.
    if isinstance(value, str | bool):
        raise ValueError("must be an integer")
    return value


Count = Annotated[int, BeforeValidator(_a_json_number)]


_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")  # not \d: it matches any Unicode digit


def _a_json_date(value: Any) -> Any:
    # The schema's date is a string YYYY-MM-DD (as ingest reads dates); pydantic alone would
    # also read 0 and "0" as 1970-01-01, "86400" as the day after, and a midnight date-time.
    if isinstance(value, date) or (isinstance(value, str) and _DAY.fullmatch(value)):
        return value
    raise ValueError("must be a date YYYY-MM-DD")


Day = Annotated[date, BeforeValidator(_a_json_date)]


def _an_iso_moment(value: Any) -> Any:
    # A query parameter is always text; pydantic alone would read "0.5" as a Unix time.
    if isinstance(value, str) and not re.match(r"\d{4}-\d{2}-\d{2}", value):
        raise ValueError("must be an ISO 8601 date-time (YYYY-MM-DDTHH:MM:SS, UTC without a zone)")
    return value


def _a_storable_moment(value: datetime) -> datetime:
    # Near year 1 or 9999 a zone's offset, the default window or the database's binding
    # overflows (a 500); no record is from before 1970, and none is from the far future.
    try:
        utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:
        raise ValueError("must be a moment between 1970 and 9000") from None
    if not MOMENT_RANGE[0] <= utc <= MOMENT_RANGE[1]:
        raise ValueError("must be a moment between 1970 and 9000")
    return value


MOMENT_RANGE = (datetime(1970, 1, 1, tzinfo=UTC), datetime(9000, 1, 1, tzinfo=UTC))
# The range as the published schema says it, so that a client (or a fuzzer) generating from
# it keeps inside: the years 1971 to 8999, whatever zone offset follows, are all in range.
MOMENT_SCHEMA = {
    "type": "string",
    "format": "date-time",
    "pattern": "^(197[1-9]|19[89][0-9]|[2-8][0-9]{3})-",
}
Moment = Annotated[
    datetime,
    BeforeValidator(_an_iso_moment),
    AfterValidator(_a_storable_moment),
    WithJsonSchema(MOMENT_SCHEMA),
]


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    top_k: Count = Field(default=10, ge=1, le=100)
    group_by: Literal["chunk", "document"] = "chunk"


class LaneRanks(BaseModel):
    bm25: int | None = Field(description="1-based rank in the BM25 lane, null if absent")
    dense: int | None = Field(description="1-based rank in the dense lane, null if absent")
    exact: int | None = Field(
        default=None,
        description="1-based rank among chunks quoting an identifier of the query verbatim",
    )


class SearchResult(BaseModel):
    chunk_id: str
    doc_id: str
    version: str
    title: str
    uri: str
    score: float = Field(
        description="Fused score, higher is better: by `retrieval.fusion` (by document, "
        "`retrieval.document_fusion`), an RRF sum or a weighted sum of min-max normalised "
        "lane scores; compare within one response"
    )
    text: str
    lanes: LaneRanks


class SearchResponse(BaseModel):
    results: list[SearchResult]
    degraded: list[str] = Field(description="Lanes that did not answer within their budget")
    trace_id: str
    policy_version: str
    index_generation: int
    timings_ms: dict[str, float] = Field(
        default_factory=dict, description="Milliseconds per stage, as in /answer"
    )


class AnswerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    top_k: Count = Field(default=10, ge=1, le=100, description="Fused candidates considered")
    stream: StrictBool = Field(
        default=False,
        description="Server-sent events: evidence, answer tokens, then the final answer "
        "(also chosen by Accept: text/event-stream)",
    )


class Citation(BaseModel):
    n: int = Field(description="The number the answer text cites as [n]")
    chunk_id: str
    doc_id: str
    version: str
    title: str
    uri: str


class AnswerResponse(BaseModel):
    answer: str = Field(description="Empty when abstained")
    abstained: bool
    abstain_reason: str | None = Field(
        description="When abstained: no_permitted_evidence | insufficient_evidence | "
        "model_declined | ungrounded | budget_exceeded"
    )
    citations: list[Citation]
    degraded: list[str]
    truncated: bool = Field(
        default=False,
        description="The LLM's answer stopped at its token limit and keeps only its whole "
        "sentences",
    )
    trace_id: str
    policy_version: str
    index_generation: int
    timings_ms: dict[str, float] = Field(description="Milliseconds per stage")


class DocumentOut(BaseModel):
    doc_id: str
    version: str
    title: str
    uri: str
    tenant: str
    region: str
    effective_from: date
    effective_to: date | None
    text: str
    chunk_ids: list[str]


class ChunkOut(BaseModel):
    chunk_id: str
    doc_id: str
    version: str
    ordinal: int
    title: str
    uri: str
    text: str
    token_count: int


class Embedding(BaseModel):
    """The numerics vectors are made in (docs/operations.md, "Embedding precision")."""

    passages: str = Field(
        description="What this process embeds passages in, e.g. bfloat16, float32, "
        "cuda:bfloat16 (its setting GATEWAY_EMBEDDING_PRECISION and the hardware it found)"
    )
    queries: str = Field(
        description="What it embeds queries in: int8 or float32 through ONNX (int8 where the "
        "CPU has int8 dot products and the setting is auto), else as passages"
    )
    index: list[str] = Field(
        description="What the served generation's vectors were embedded in; more than one "
        "after a change of numerics without a reindex"
    )


class Processes(BaseModel):
    """A `gateway serve --processes N` group's processes, as its parent last counted them."""

    ready: int = Field(description="Processes that have finished their start and still run")
    of: int = Field(description="Processes the group runs (`--processes`)")


class Health(BaseModel):
    status: Literal["ok", "ready"]
    index_generation: int | None = None
    policy_version: str | None = None
    embedding: Embedding | None = None
    index_store: Literal["reachable", "unreachable"] | None = Field(
        default=None,
        description="With the index on object storage: whether the store answered lately "
        "(unreachable: this replica serves its local copy, and nothing newer exists)",
    )
    processes: Processes | None = Field(
        default=None,
        description="Served from several processes (`--processes`): how many have started; "
        "the group is ready from the first, so fewer than `of` means one is starting or "
        "failing to start (absent for one process)",
    )


class FieldError(BaseModel):
    """One reason a request was invalid; never the value that was sent."""

    loc: list[str | int] = Field(description='Where: "body", then field names and list indexes')
    msg: str = Field(description="What is wrong, in words")
    type: str = Field(description="Machine-readable kind, e.g. missing, string_too_long")


class DocumentError(BaseModel):
    """One problem of an ingest batch or job: which document (its place in the batch and
    its doc_id; null for the batch as a whole), which field, and what is wrong."""

    index: int | None
    doc_id: str | None
    field: str | None
    message: str


class Problem(BaseModel):
    """application/problem+json (RFC 9457)."""

    type: str
    title: str
    status: int
    code: str
    detail: str | None = None
    errors: list[FieldError | DocumentError] | None = Field(
        default=None,
        description="422 only: each invalid field's location, message and type; for "
        "POST /admin/documents each problem's document index, doc_id, field and message",
    )
    serving_version: str | None = Field(
        default=None, description="409 policy_refused only: the policy version still serving"
    )
    problems: list[str] | None = Field(
        default=None,
        description="422 invalid_policy only: every problem of the policy sent, one each "
        "(file: key: what is wrong), as `gateway policy check` prints them",
    )


# -- admin ---------------------------------------------------------------------------------


class ReloadOut(BaseModel):
    at: datetime
    outcome: Literal["loaded", "unchanged", "refused"]
    version: str = Field(description="The policy version serving after the attempt")
    problems: str = Field(default="", description="Why a refused policy was refused")


class PolicyOut(BaseModel):
    version: str
    files: list[str]
    directory: str
    loaded_at: datetime
    last_reload: ReloadOut | None = Field(description="Null until the first reload attempt")


class ExplainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    subject: dict[str, Any] = Field(
        description="The caller's token claims, as the identity provider would send them"
    )
    doc_id: str = Field(
        min_length=1,
        description="At most 1,024 bytes in UTF-8, as ingest keeps; a longer one names no "
        "document (404)",
    )
    as_of: Day | None = Field(default=None, description="Default: today (UTC)")


class ExplainCaller(BaseModel):
    subject: str
    tenant: str
    region: str
    principals: list[str]
    readable_regions: list[str]


class ExplainVersion(BaseModel):
    version: str
    effective_from: date
    effective_to: date | None
    visible: bool
    rule: str = Field(description="The rule that decided: the first that failed, else acl")
    matched_principals: list[str]
    granted_by: dict[str, str] = Field(description="Matched principal -> policy rule")


class ExplainResponse(BaseModel):
    doc_id: str
    as_of: date
    visible: bool
    version: str | None = Field(description="The version the caller would see, if any")
    rule: str = Field(
        description="no_principals | tenant | region | acl | effective_from | effective_to"
        " | insufficient_claims | account_disabled"
    )
    detail: str | None = Field(
        default=None,
        description="With insufficient_claims or account_disabled: why, as a token with these "
        "claims is told in its 403 (claim names, never their values); null otherwise",
    )
    caller: ExplainCaller | None = Field(
        description="Null when the claims are refused (insufficient_claims, account_disabled)"
    )
    versions: list[ExplainVersion]
    policy_version: str


# -- ingest routes -------------------------------------------------------------------------


# kind:name by the rule of every door (gateway/domain.py, `principal_problem`), so that a
# push takes the ACL `gateway ingest` and tokens take (`group:Équipe-Paris`, a ZWNJ or a
# no-break space inside a name): no control character (Cc) anywhere, nor whitespace
# (Python's, as str.strip() takes it) at either end of the name. The pattern says what a
# JSON Schema pattern can, so a value it admits is one the route takes; the validator is
# the rule itself, with a message that names the problem (and refuses a lone surrogate,
# which a pattern cannot name).
_CONTROL = r"\x00-\x1f\x7f-\x9f"
_EDGE = rf"[^{_CONTROL}\x20\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
PRINCIPAL_PATTERN = rf"^[A-Za-z][A-Za-z0-9_.-]*:{_EDGE}(?:[^{_CONTROL}]*{_EDGE})?$"


def _a_principal(value: str) -> str:
    problem = principal_problem(value)
    if problem is not None:
        raise ValueError(f"{value!r:.60} {problem}")
    return canonical_name(value)  # NFC, as claims are compared


Principal = Annotated[
    str,
    StringConstraints(max_length=1000),
    AfterValidator(_a_principal),
    WithJsonSchema({"type": "string", "maxLength": 1000, "pattern": PRINCIPAL_PATTERN}),
]


class PreviewRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    files: dict[str, str] = Field(
        min_length=1,
        description="The edited policy: file name (*.yaml or *.yml, no directory) -> YAML text",
    )
    as_of: Day | None = Field(default=None, description="Default: today (UTC)")


class PreviewCoverage(BaseModel):
    documents: int = Field(description="Versions of your tenant in force on as_of")
    regions: list[str] = Field(
        description="Caller regions that read a version of your tenant under either policy"
    )
    groups: int = Field(
        description="Groups (each a kind of caller) whose members read a version of your "
        "tenant under either policy"
    )
    users: int = Field(description="Users your tenant's ACLs name")
    directory_groups: int = Field(
        default=0, description="Groups of your tenant's directory (SCIM), counted as callers"
    )
    notes: list[str]


class PreviewChange(BaseModel):
    regions: list[str] = Field(description="A caller in any of these regions")
    groups: list[str] = Field(description="holding any one of these groups")
    users: list[str] = Field(description="or being one of these subjects")
    gains: list[str] = Field(description="Versions (doc_id@version) it would see and does not")
    losses: list[str] = Field(description="Versions it sees now and would not")


class PolicyPreview(BaseModel):
    base_version: str = Field(description="The policy serving now")
    new_version: str = Field(description="The version the edited files would have")
    as_of: date
    widens: bool = Field(description="Whether any caller of your tenant gains a document")
    gained: int = Field(description="Versions some caller gains")
    lost: int = Field(description="Versions some caller loses")
    covers: PreviewCoverage
    changes: list[PreviewChange]


class AclChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    acl: list[Principal] = Field(
        min_length=1, max_length=10_000, description="The principals that may read it"
    )
    version: str | None = Field(
        default=None,
        min_length=1,
        description="Only this version; all if absent. At most 1,024 bytes in UTF-8, as "
        "ingest keeps; a longer one names no version (404)",
    )


class DocumentChanged(BaseModel):
    doc_id: str
    versions: int = Field(description="Versions changed (0: nothing to change)")
    index_generation: int | None = Field(
        description="The generation that enforces the change; every request from now on reads "
        "it or a newer one"
    )


# Identifiers as ingest accepts them; its own checks (no control characters, no spaces at
# either end; versions without '@', ':', '/' or spaces) add what a schema cannot say.
Ident = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class IngestDocument(BaseModel):
    """One document version, with the fields (and rules) of a file's metadata."""

    model_config = ConfigDict(extra="forbid")

    doc_id: Ident = Field(description="At most 1,024 bytes in UTF-8")
    version: Ident = Field(
        default="1",
        description="Default 1; no '@', ':', '/' or spaces; at most 1,024 bytes in UTF-8",
    )
    title: str | None = Field(
        default=None, max_length=2000, description="Default: the first # heading, or doc_id"
    )
    text: str = Field(min_length=1, description="The body: Markdown or plain text")
    region: Ident
    acl: list[Principal] = Field(
        min_length=1, max_length=10_000, description="The principals that may read it"
    )
    effective_from: Day = Field(description="First day it is in force (YYYY-MM-DD)")
    effective_to: Day | None = Field(default=None, description="Last day; open-ended if absent")
    uri: str | None = Field(default=None, max_length=4000)
    tenant: Ident | None = Field(default=None, description="If given, the caller's tenant")


class IngestBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[IngestDocument] = Field(min_length=1, max_length=MAX_BATCH_DOCUMENTS)


class JobOut(BaseModel):
    job_id: str
    kind: Literal["ingest"]
    status: Literal["queued", "running", "succeeded", "failed"]
    documents: int = Field(description="Documents in the batch")
    chunks: int = Field(description="Chunks written for them (0 until it succeeds)")
    unchanged: int = Field(description="Documents stored exactly as sent before: left as is")
    index_generation: int | None = Field(
        description="The generation that serves the result (once succeeded)"
    )
    errors: list[DocumentError] = Field(description="Why it failed; empty otherwise")
    created_at: datetime
    finished_at: datetime | None
    documents_done: int = Field(
        description="Documents embedded (or found unchanged) so far; all of them once it succeeds"
    )
    chunks_done: int = Field(description="Chunks embedded so far")
    chunks_planned: int | None = Field(
        description="Chunks to embed, once the writer has chunked the batch (null before)"
    )


class ClaimNamesOut(BaseModel):
    """The token claims that carry identity under the serving policy (its `claims:`, and
    its directory's `user_claim`)."""

    subject: str = Field(description="The subject's claim, e.g. sub")
    tenant: str = Field(description="The tenant's claim, e.g. tenant")
    region: str = Field(description="The region's claim, e.g. region")
    groups: str = Field(description="The groups' claim, e.g. groups")
    user: str | None = Field(
        default=None,
        description="The claim naming the caller's directory user (the policy's "
        "directory.user_claim, e.g. sub or oid), which a token of a tenant with a SCIM "
        "directory must carry; null when your tenant has no directory",
    )


class IndexOut(BaseModel):
    index_generation: int | None = Field(description="The generation this process serves")
    generation_created_at: datetime | None = Field(description="When it was committed")
    documents: int = Field(description="Your tenant's documents (distinct doc_id)")
    versions: int = Field(description="Their versions, past and future ones included")
    chunks: int = Field(description="Chunks of those versions")
    jobs: list[JobOut] = Field(description="Your tenant's newest ingest jobs, newest first")
    claims: ClaimNamesOut = Field(
        description="The claim names the serving policy reads identity from, for claims to "
        "try with POST /admin/explain"
    )


class AuditRecordOut(BaseModel):
    """One request to a protected route, by IDs only: never a query, a text or a token."""

    id: int = Field(description="Order of recording; `before` pages by it")
    time: datetime = Field(description="When the request arrived (UTC)")
    trace_id: str | None = Field(description="The request's trace, for routes that open one")
    subject: str = Field(description="The caller: the token's subject, or the API key's ID")
    tenant: str
    route: str = Field(description="The route's template, e.g. /documents/{doc_id}")
    status: int = Field(description="The HTTP status the caller got")
    policy_version: str | None
    index_generation: int | None
    doc_ids: list[str] = Field(description="Documents that came back, were cited or changed")
    chunk_ids: list[str] = Field(description="Chunks that came back or were cited")
    degraded: list[str] = Field(description="Lanes that did not answer")
    abstain_reason: str | None
    duration_ms: float
    versions: list[str] = Field(
        default_factory=list, description="Versions a write changed or queued, as doc_id@version"
    )
    job_id: str | None = Field(default=None, description="The ingest job a push queued")
    tool: str | None = Field(default=None, description="The MCP tool a call to /mcp ran")


class AuditPage(BaseModel):
    records: list[AuditRecordOut] = Field(description="Newest recorded first")
    next_before: int | None = Field(
        description="Pass as `before` for the next page; null on the last page"
    )
