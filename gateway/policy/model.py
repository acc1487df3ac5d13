"""The policy's shape: frozen pydantic models, unknown keys rejected."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from functools import cached_property
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from gateway.domain import canonical_name, name_problem
from gateway.policy.bounds import Preview
from gateway.policy.numbers import NUMBER_ONLY, Number, Whole

# The lanes `retrieval.weights` may weigh: each lane's `name` (gateway/retrieval/lanes),
# written out because the retrieval package imports this one; tests/test_policy_loader.py
# keeps the two equal. `budgets` names them too (bm25_ms, dense_ms, exact_ms).
LANES = ("bm25", "dense", "exact")

# Every route whose requests leave an audit record (those that authenticate their caller:
# gateway/api/audit.py), as `audit.required` names them: route templates, as the OpenAPI
# document and the records' `route` do. tests/test_policy_loader.py keeps it equal to the
# app's authenticated routes.
AUDITED_ROUTES = frozenset(
    {
        "/search",
        "/answer",
        "/documents/{doc_id}",
        "/chunks/{chunk_id}",
        "/mcp",
        "/v1/chat/completions",
        "/v1/models",
        "/v1/models/{model}",
        "/admin/audit",
        "/admin/documents",
        "/admin/documents/{doc_id}",
        "/admin/documents/{doc_id}/acl",
        "/admin/explain",
        "/admin/index",
        "/admin/jobs/{job_id}",
        "/admin/policy",
        "/admin/policy/preview",
        "/admin/policy/reload",
        "/scim/v2/.search",
        "/scim/v2/Groups",
        "/scim/v2/Groups/.search",
        "/scim/v2/Groups/{group_id}",
        "/scim/v2/ResourceTypes",
        "/scim/v2/ResourceTypes/{type_id}",
        "/scim/v2/Schemas",
        "/scim/v2/Schemas/{schema_id}",
        "/scim/v2/ServiceProviderConfig",
        "/scim/v2/Users",
        "/scim/v2/Users/.search",
        "/scim/v2/Users/{user_id}",
    }
)
MAX_SHOWN = 5  # refused entries named in one message; a list of thousands is not repeated


def _listed(values: list[str]) -> str:
    shown = ", ".join(f"{v!r:.60}" for v in values[:MAX_SHOWN])
    more = len(values) - MAX_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def _checked_name(name: str) -> str:
    """A subject, group or principal the policy names, by the rule of every name
    (gateway/domain.py, `name_problem`): "gateway-admins\\u00a0" would load and never match
    a caller. In NFC, as claims and ACLs are compared."""
    problem = name_problem(name)
    if problem is not None:
        raise ValueError(f"{name!r:.60} {problem}")
    return canonical_name(name)


Name = Annotated[str, AfterValidator(_checked_name)]


class _Frozen(BaseModel):
    """Every section of the policy: unknown keys refused, and numbers that are numbers.

    Number fields are `Number` / `Whole` (gateway/policy/numbers.py: no boolean or text
    taken for a number). NaN and infinities are refused everywhere: no bound or threshold
    of a policy means anything as either (a NaN `min_relevance` would never abstain)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ClaimNames(_Frozen):
    """Which token claims carry identity; the contract's names by default."""

    subject: str = "sub"
    tenant: str = "tenant"
    region: str = "region"
    groups: str = "groups"

    @model_validator(mode="after")
    def _four_claims(self) -> ClaimNames:
        # One claim cannot be a string identity and the list of groups, or two identities;
        # such a mapping resolves nobody as written, so it is refused when the policy loads.
        names = (self.subject, self.tenant, self.region, self.groups)
        if len(set(names)) < len(names):
            raise ValueError("subject, tenant, region and groups must name four different claims")
        return self


class Grant(_Frozen):
    """Members of `group` also hold the principals in `grants` (e.g. support:eu)."""

    group: Name = Field(min_length=1)
    grants: tuple[Name, ...] = Field(min_length=1)


class Members(_Frozen):
    """Listed subjects, and members of listed groups (after nesting)."""

    subjects: tuple[Name, ...] = ()
    groups: tuple[Name, ...] = ()

    def match(self, subject: str, groups: set[str] | frozenset[str]) -> bool:
        return subject in self.subjects or not groups.isdisjoint(self.groups)


class Admins(Members):
    """Admins of a tenant: they use the tenant-scoped /admin routes (explain) for the tenant
    in their own token only. `subjects` and `groups` make an admin in whichever tenant the
    token names; `tenants` names a tenant's own admins, who are admins there and nowhere
    else (a subject `ann` of one tenant is not `ann` of another). API keys are never admins."""

    tenants: dict[str, Members] = Field(
        default_factory=dict, description="tenant -> the admins of that tenant only"
    )


class Operators(Members):
    """The operators of the deployment: the global /admin routes (read and reload the policy,
    which every tenant shares). Only callers of `tenant` match; nobody when it is empty."""

    tenant: str = Field(default="", description="the operators' own tenant")


class Regions(_Frozen):
    """Which document regions a caller region reads besides its own."""

    global_region: str = "GLOBAL"
    global_readable: bool = Field(
        default=False, description="Documents in global_region are readable from every region."
    )
    also_reads: dict[str, tuple[str, ...]] = Field(
        default_factory=dict, description="caller region -> further readable regions"
    )


class Budgets(_Frozen):
    """Per-lane time budgets in milliseconds; the dense budget covers embed_query + dense."""

    bm25_ms: Number = Field(default=300.0, gt=0, le=60_000)
    dense_ms: Number = Field(default=800.0, gt=0, le=60_000)
    exact_ms: Number = Field(default=300.0, gt=0, le=60_000)
    llm_ms: Number = Field(
        default=20_000.0,
        gt=0,
        le=600_000,
        description="The LLM call; past it the extractive answer serves, degraded: [llm]",
    )
    workers_per_lane: Whole = Field(default=4, ge=1, le=64)
    # Abandoned lane calls still run to completion (threads cannot be cancelled); with this
    # many of one tenant's still running, the lane is skipped (degraded) for that tenant
    # instead of adding more. Per tenant, so that one tenant's late work never degrades
    # another's; below workers_per_lane, so that one tenant cannot hold every worker.
    max_abandoned_per_lane: Whole = Field(default=2, ge=1, le=64)

    def lane_ms(self, lane: str) -> float:
        budget: float = getattr(self, f"{lane}_ms")
        return budget


class Retrieval(_Frozen):
    """Candidate depth, fusion and engine choice (formulas in gateway/retrieval/fuse.py)."""

    candidates_per_lane: Whole = Field(default=50, ge=1, le=1000)
    fusion: Literal["rrf", "weighted", "layered"] = "rrf"
    rrf_k: Whole = Field(default=60, ge=1)
    weights: dict[str, Number] = Field(
        default_factory=lambda: {"bm25": 1.0, "dense": 1.0, "exact": 1.0},
        description="Per-lane weights of `weighted` fusion (a missing lane weighs 1)",
        # What `_known_lanes_weighed` refuses, stated in the schema too, so that an editor
        # flags a misspelt lane or a negative weight as the loader would.
        json_schema_extra={
            "propertyNames": {"enum": list(LANES)},
            "additionalProperties": {"type": "number", "minimum": 0},
        },
    )
    rerank_candidates: Whole = Field(
        default=20, ge=1, le=200, description="Fused candidates a cross-encoder reorders"
    )
    document_ranking: Literal["best_chunk", "decayed_sum", "rrf_sum", "layered"] = Field(
        default="best_chunk",
        description="group_by document: how each lane ranks a document from its chunks "
        "before the lanes are fused: where its best chunk ranks, or a decayed sum over its "
        "best `document_chunks` chunks of their min-max normalised scores or RRF terms "
        "(`layered`: RRF terms of the chunks both BM25 and dense found only)",
    )
    document_chunks: Whole = Field(
        default=3, ge=1, le=20, description="Chunks of a document a sum counts, best first"
    )
    document_decay: Number = Field(
        default=0.5, gt=0, le=1, description="Weight of each further chunk in a sum"
    )
    # Chosen by `gateway eval` (fused nDCG@10 by document, docs/evaluation.md, "Ranking
    # documents"): BM25 over whole documents fused by weight with dense's best chunks scored
    # 0.9220 on the SQuAD slice and 0.7358 on SciFact train, against 0.9010 and 0.6839 for
    # best chunks fused by RRF (the earlier default); no other mode or combination beat it
    # on both.
    document_fusion: Literal["rrf", "weighted", "layered"] = Field(
        default="weighted",
        description="group_by document: how the lanes' rankings of documents are fused "
        "(the modes of `fusion`, which still fuses chunks: the evidence each document is "
        "shown by, and every chunk-level search and answer)",
    )
    document_bm25: bool = Field(
        default=True,
        description="group_by document: the BM25 lane's vote is BM25 over each whole "
        "document (its chunks' text, overlaps once) instead of one derived from its chunks",
    )
    document_vector: Literal["off", "mean", "first"] = Field(
        default="off",
        description="group_by document: the dense lane's vote is the cosine of a vector "
        "per document, the mean of its chunks' (`mean`) or its first chunk's (`first`), "
        "instead of one derived from its chunks (universes searched in memory only)",
    )

    @field_validator("weights")
    @classmethod
    def _known_lanes_weighed(cls, weights: dict[str, float]) -> dict[str, float]:
        # A misspelt lane would weigh nothing while the lane meant kept its weight of 1, and
        # a negative weight would rank a lane's best candidates last.
        unknown = [lane for lane in weights if lane not in LANES]
        if unknown:
            raise ValueError(f"unknown lane {_listed(unknown)}; the lanes are {', '.join(LANES)}")
        negative = [lane for lane, weight in weights.items() if weight < 0]
        if negative:
            raise ValueError(f"a weight must be 0 or more: {_listed(negative)}")
        return weights

    @field_validator("document_vector", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        return "off" if value is False else value  # YAML 1.1 reads a bare `off` as false

    # Measured by scripts/measure_filtered_ann.py on 200,000 rows (docs/evaluation.md, "Dense
    # engine recall under the permission filter"): exact search in memory took 1.3, 9.2 and
    # 20 ms with 1%, 10% and all rows permitted, LanceDB's IVF-PQ 50-67 ms. With 64 probes
    # and 20x refinement its recall@10 was 0.977, 0.985 and 0.966; 64/8 dropped to 0.898
    # unfiltered, 32/4 to 0.771. At a million rows the prefiltered IVF-PQ search took
    # 360-400 ms (its filter reads every row) against 10 and 77 ms for the exact pass over
    # 10% and 85% of the rows, so the index only pays beyond a few million (CHANGELOG.md,
    # "Dense engines: exact in memory against filtered ANN").
    flat_search_max_rows: Whole = Field(
        default=2_000_000,
        ge=0,
        description="Restricted universes up to this many chunks are searched exactly in "
        "memory; larger ones by LanceDB's ANN index when the table has one.",
    )
    ann_min_rows: Whole = Field(
        default=2_000_000,
        ge=1,
        description="Ingest builds an IVF-PQ index on the vector table once it has this many "
        "rows; smaller tables are only ever searched exactly",
    )
    ann_nprobes: Whole = Field(default=64, ge=1, le=4096, description="IVF partitions searched")
    ann_refine_factor: Whole = Field(
        default=20, ge=1, le=100, description="Candidates re-scored exactly, times top k"
    )


class Chunking(_Frozen):
    """How ingest cuts documents: in word pieces of the embedding model (window 256, less
    the title that is embedded with every chunk). Changing it applies to what is ingested
    (or reindexed) afterwards."""

    # Measured with `gateway eval`: 96/24 beat 128/32, 160/32 and 224/32 on both the SQuAD
    # slice and a long-document variant of it, for BM25, dense and fused alike
    # (docs/evaluation.md, "Retrieval on the SQuAD 2.0 dev slice, per lane and fused").
    max_tokens: Whole = Field(default=96, ge=32, le=224)
    overlap_tokens: Whole = Field(default=24, ge=0, le=112)


class Ingest(_Frozen):
    """The push API's queue (`POST /admin/documents`)."""

    max_pending_jobs: Whole = Field(
        default=100,
        ge=1,
        le=100_000,
        description="Jobs one tenant may have queued or running; beyond it 429 ingest_backlog",
    )
    coalesce_documents: Whole = Field(
        default=2000,
        ge=1,
        le=100_000,
        description="A writer that is behind joins queued jobs of one tenant into one "
        "generation, up to this many documents",
    )
    max_pending_bytes: Whole = Field(
        default=128 * 2**20,
        ge=1,
        le=2**40,
        description="Bytes of documents one tenant may have queued or running; a batch that "
        "would pass it is 429 ingest_backlog (one batch alone is always taken)",
    )
    slice_chunks: Whole = Field(
        default=512,
        ge=1,
        le=100_000,
        description="The writer embeds this many chunks of one tenant's claim, then turns to "
        "the next tenant with jobs waiting (about a minute on two cores)",
    )


class Rate(_Frozen):
    """A token bucket: `burst` requests at once, refilled at `rate_per_s`."""

    rate_per_s: Number = Field(gt=0, le=1_000_000)
    burst: Whole = Field(ge=1, le=1_000_000)


class Limits(_Frozen):
    """Request rates of every protected route; absent: unlimited. Per server (replica)."""

    per_subject: Rate | None = Field(default=None, description="each caller (subject or key)")
    per_tenant: Rate | None = Field(default=None, description="all callers of one tenant")
    retrievals_per_tenant: Annotated[int, Field(ge=1, le=10_000), NUMBER_ONLY] | None = Field(
        default=None,
        description="A tenant's searches and answers retrieving at once, per process; more "
        "wait their turn while other tenants' go straight in (absent: no bound)",
    )


class Audit(_Frozen):
    """The audit trail: one ID-only record per request to a protected route."""

    required: tuple[str, ...] = Field(
        default=("/search", "/answer"),
        description="Routes refused (503 audit_unavailable) while their records cannot be "
        "written; on other routes a record that cannot be written is dropped and counted",
        # What `_audited_routes` refuses, stated in the schema too (an editor flags /serach).
        json_schema_extra={"items": {"type": "string", "enum": [*sorted(AUDITED_ROUTES)]}},
    )
    retention_days: Whole = Field(
        default=365, ge=1, le=36_500, description="Records older than this are deleted"
    )

    @field_validator("required")
    @classmethod
    def _audited_routes(cls, required: tuple[str, ...]) -> tuple[str, ...]:
        # A route the gateway does not serve as written (`/serach`, `search`) would leave
        # the route meant served without its record while the database refuses records:
        # fail-closed auditing turned off by a typo.
        unknown = [route for route in required if route not in AUDITED_ROUTES]
        if unknown:
            raise ValueError(
                f"not a route that leaves an audit record: {_listed(unknown)}; name route "
                'templates, e.g. /search, /answer, /documents/{doc_id} (docs/policy.md, "audit")'
            )
        return required


class Retention(_Frozen):
    """How long erased and superseded versions may linger (docs/security.md, "Erasure")."""

    superseded_days: Annotated[int, Field(ge=0, le=36_500), NUMBER_ONLY] | None = Field(
        default=None,
        description="A version superseded (closed by a newer one) this many days ago is "
        "deleted and erased; absent: superseded versions are kept",
    )
    erase_within_s: Whole = Field(
        default=3600,
        ge=0,
        le=30 * 86_400,
        description="A deleted version's text, title and vectors are gone from every file "
        "and object the gateway owns within this many seconds of the delete",
    )


class Answering(_Frozen):
    """Evidence budget and the extractive answerer's limits."""

    context_tokens: Whole = Field(default=1200, ge=50, le=100_000)
    expand_neighbours: Whole = Field(
        default=1,
        ge=0,
        le=10,
        description="Chunks on each side of a retrieved chunk, in its section, that join the "
        "evidence (0: only what was retrieved)",
    )
    max_sentences: Whole = Field(default=3, ge=1, le=20)
    max_words: Whole = Field(default=80, ge=10, le=1000)
    min_relevance: Number = Field(
        default=0.575, description="Below this best-sentence score the answer abstains."
    )


class Llm(_Frozen):
    """The LLM answerer, when GATEWAY_LLM_BASE_URL and GATEWAY_LLM_MODEL configure one."""

    tenant_models: dict[str, str] = Field(
        default_factory=dict,
        description="tenant -> model served by the endpoint; others get GATEWAY_LLM_MODEL",
    )
    context_tokens: Whole = Field(
        default=2048,
        ge=256,
        le=2_000_000,
        description="The model's context window: system, question, evidence and the reserved "
        'answer never exceed it (tokens estimated conservatively: docs/policy.md, "llm")',
    )
    answer_tokens: Whole = Field(
        default=300, ge=16, le=100_000, description="Reserved for, and the limit of, the answer"
    )
    temperature: Number = Field(default=0.0, ge=0, le=2)
    max_concurrent: Whole = Field(
        default=8,
        ge=1,
        le=10_000,
        description="Answers the LLM may be writing at once, per serving process; beyond "
        "it /answer is 503 llm_busy with Retry-After",
    )

    @model_validator(mode="after")
    def _room_for_evidence(self) -> Llm:
        if self.answer_tokens > self.context_tokens // 2:
            raise ValueError("answer_tokens must leave at least half of context_tokens")
        return self


class Directory(_Frozen):
    """How a caller is matched to a user the identity provider provisioned by SCIM
    (docs/policy.md, "directory"): the token's `user_claim` equals the directory user's
    `user_attribute`. A matched caller holds its directory groups beside its token's, and
    is refused while the directory user is inactive or deleted."""

    user_claim: str = Field(default="sub", min_length=1, description="the token's claim")
    user_attribute: Literal["userName", "externalId", "id"] = Field(
        default="userName", description="the directory user's attribute it must equal"
    )


class Policy(_Frozen):
    """Claims -> principals, readable regions and admin rights; retrieval and answer settings.

    Precedence (docs/policy.md, "From claims to a caller"): identity claims are required;
    principals are the subject, the token's groups, the groups they are nested in, and the
    grants of all of those; nothing else widens a caller. No rule matching means no
    principal: deny.
    """

    claims: ClaimNames = ClaimNames()
    nested_groups: dict[Name, tuple[Name, ...]] = Field(
        default_factory=dict,
        description="group -> the groups it is nested in: its members belong to those too, "
        "transitively (e.g. {support-eu: [support], support: [staff]})",
    )
    grants: tuple[Grant, ...] = ()
    regions: Regions = Regions()
    budgets: Budgets = Budgets()
    retrieval: Retrieval = Retrieval()
    chunking: Chunking = Chunking()
    ingest: Ingest = Ingest()
    limits: Limits = Limits()
    audit: Audit = Audit()
    retention: Retention = Retention()
    answering: Answering = Answering()
    llm: Llm = Llm()
    admins: Admins = Admins()
    operators: Operators = Operators()
    preview: Preview = Preview()
    directory: Directory = Directory()

    @cached_property
    def _grant_index(self) -> tuple[tuple[Grant, ...], dict[str, list[int]]]:
        index: dict[str, list[int]] = {}
        for position, grant in enumerate(self.grants):
            index.setdefault(grant.group, []).append(position)
        return self.grants, index

    def grants_of(self, groups: Iterable[str]) -> list[Grant]:
        """The grants of these groups in policy order, found by group: resolving a caller
        costs what its groups hold, not a pass over every grant (a diff resolves one caller
        per group, which would make it quadratic)."""
        grants, index = self._grant_index
        if grants is not self.grants:  # a model_copy that replaced the grants
            del self.__dict__["_grant_index"]
            grants, index = self._grant_index
        return [grants[i] for i in sorted(i for g in groups for i in index.get(g, ()))]

    @field_validator("nested_groups", mode="before")
    @classmethod
    def _each_group_once(cls, nested: object) -> object:
        # One group written twice, composed and decomposed ("José"), is one key in NFC: the
        # later entry would silently replace the earlier.
        if isinstance(nested, dict):
            counted = Counter(canonical_name(k) for k in nested if isinstance(k, str))
            twice = sorted(name for name, count in counted.items() if count > 1)
            if twice:
                raise ValueError(f"groups given twice (equal in Unicode NFC): {_listed(twice)}")
        return nested

    @field_validator("nested_groups")
    @classmethod
    def _nesting_has_no_cycle(
        cls, nested: dict[str, tuple[str, ...]]
    ) -> dict[str, tuple[str, ...]]:
        # A cycle makes every group on it hold every other's documents: always a mistake,
        # and one that widens silently. A field validator, so it is reported beside the
        # problems of other keys.
        cycles = nesting_cycles(nested)
        if cycles:
            shown = "; ".join(_cycle_text(cycle) for cycle in cycles[:MAX_CYCLES_SHOWN])
            more = len(cycles) - MAX_CYCLES_SHOWN
            raise ValueError(f"a cycle: {shown}" + (f"; and more ({more}+)" if more > 0 else ""))
        return nested


# A nesting built so that every group closes a cycle through every other would have its
# cycles' groups grow with the square of its size (a 61 KB edit made a 38 MB message):
# the search stops after a few cycles, and a long cycle is shown by its ends.
MAX_CYCLES_SHOWN = 5
MAX_CYCLE_GROUPS_SHOWN = 8


def _cycle_text(cycle: list[str]) -> str:
    if len(cycle) > MAX_CYCLE_GROUPS_SHOWN:
        hidden = len(cycle) - (MAX_CYCLE_GROUPS_SHOWN - 1)
        cycle = [*cycle[: MAX_CYCLE_GROUPS_SHOWN - 2], f"({hidden} more)", cycle[-1]]
    return " -> ".join([*cycle, cycle[0]])


def nesting_cycles(
    nested: dict[str, tuple[str, ...]], limit: int = MAX_CYCLES_SHOWN + 1
) -> list[list[str]]:
    """Cycles of the nesting graph (their groups in order), by depth-first search, each
    once, and at most `limit` of them: enough to name a few and to say there are more."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []
    for root in sorted(nested):
        if root in state:
            continue
        if len(cycles) >= limit:
            break
        path: list[str] = []
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:
            group, index = stack.pop()
            if index == 0:
                state[group] = 1
                path.append(group)
            parents = nested.get(group, ())
            if index < len(parents):
                stack.append((group, index + 1))
                parent = parents[index]
                if state.get(parent) == 1:
                    cycles.append(path[path.index(parent) :])
                    if len(cycles) >= limit:
                        return cycles
                elif parent not in state:
                    stack.append((parent, 0))
            else:
                state[group] = 2
                path.pop()
    return cycles
