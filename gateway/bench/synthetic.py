"""A synthetic corpus for `gateway bench`: enterprise-like text, realistic visibility, and
vectors drawn around real embeddings, so a million chunks can be built on two cores.

Text. A few thousand policy sentences are generated from templates ("The payroll team must
archive every invoice within 30 days under rule FIN-0412."), each with the question it
answers. These are embedded by the real model once. A chunk joins two of them; its vector
mixes their embeddings (weights 0.5-1 and the rest) plus a little noise, then normalised:
distinct points on the manifold of real sentence embeddings, not uniform random vectors,
so neighbourhoods and filtered-search recall behave as on real text. Each sentence keeps its
real embedding as the chunk's stored sentence vector, for the extractive answerer.

Visibility. Every document draws u in [0, 1) and is granted to the one ladder group of the
smallest LADDER share above u; a caller holding the groups of every share up to S sees the
share S of documents (`caller_groups`). Documents also name a few departmental groups no
benchmark caller holds. Of the documents with u >= 0.5, DECOY_SHARE carry the lowest
ladder group, which every caller holds, but another tenant, another region, an expired end
date or a future start: only the tenant, region and date filters keep them out. So at S = 1
a caller sees every document except those decoys (about 15%); `gateway bench` measures and
reports the share actually visible.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from gateway.domain import Chunk, Document, Visibility, chunk_id_for
from gateway.embedding import Embedder, pack_vectors
from gateway.ingest.encoding import Encoded

TENANT = "bench"
REGION = "EU"
LADDER = (0.001, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
DECOY_FROM = 0.5  # decoys are drawn among documents only callers of S > 0.5 could reach
DECOY_SHARE = 0.3
CHUNKS_PER_DOCUMENT = 4
NOISE = 0.01

_TEAMS = (
    "payroll", "procurement", "legal", "security", "facilities", "finance", "treasury",
    "support", "logistics", "marketing", "research", "compliance", "audit", "hiring",
    "benefits", "travel", "quality", "safety", "privacy", "sales", "engineering",
    "operations", "warehouse", "training",
)  # fmt: skip
_OBJECTS = (
    "invoice", "contract", "laptop", "badge", "expense claim", "purchase order",
    "refund request", "vendor record", "incident report", "access key", "travel booking",
    "timesheet", "audit log", "shipment", "customer complaint", "software licence",
    "parking permit", "medical certificate", "training plan", "backup tape", "server image",
    "tax form", "pension statement",
)  # fmt: skip
_VERBS = (
    "archive", "approve", "review", "encrypt", "renew", "destroy", "escalate", "verify",
    "sign", "reconcile", "report", "replace", "inspect", "register",
)  # fmt: skip
_ROLES = (
    "manager", "director", "officer", "lead", "auditor", "controller", "steward",
    "coordinator",
)  # fmt: skip
_EVENTS = (
    "a second review", "the quarterly close", "a risk assessment", "the annual audit",
    "a budget check", "written consent", "an identity check", "the vendor's reply",
)  # fmt: skip
_PLACES = (
    "Ireland", "Germany", "France", "Spain", "Italy", "Poland", "Sweden",
    "the Netherlands", "Portugal", "Austria",
)  # fmt: skip
_DISPOSALS = (
    "shredded", "deleted", "anonymised", "moved to cold storage", "returned to its owner",
)  # fmt: skip
_CONDITIONS = (
    "the owner has agreed", "a ticket is open", "the data is encrypted",
    "two people are present", "the budget allows it", "the regional office is closed",
)  # fmt: skip


@dataclass(frozen=True)
class Sentence:
    text: str
    question: str
    topic: str  # "payroll invoice": what a document made of it is titled by


def caller_groups(selectivity: float) -> list[str]:
    """The ladder groups a caller needs to see the share `selectivity` of documents."""
    return [_ladder_group(share) for share in LADDER if share <= selectivity + 1e-12]


def _ladder_group(share: float) -> str:
    return f"bench-{round(share * 1000):04d}"


def sentences(count: int, seed: int = 0) -> list[Sentence]:
    """`count` distinct generated sentences, each with the question it answers."""
    rng = np.random.default_rng(seed)
    out: dict[str, Sentence] = {}
    for n in itertools.count():
        if len(out) >= count:
            break
        team, obj = _TEAMS[rng.integers(len(_TEAMS))], _OBJECTS[rng.integers(len(_OBJECTS))]
        verb, role = _VERBS[rng.integers(len(_VERBS))], _ROLES[rng.integers(len(_ROLES))]
        code = f"{team[:3].upper()}-{n % 10000:04d}"
        days = int(rng.choice([3, 5, 7, 10, 14, 30, 60, 90, 180, 365]))
        form = n % 4
        if form == 0:
            s = Sentence(
                f"The {team} team must {verb} every {obj} within {days} days under rule {code}.",
                f"How many days does the {team} team have to {verb} the {obj}?",
                f"{team} {obj}",
            )
        elif form == 1:
            event = _EVENTS[rng.integers(len(_EVENTS))]
            s = Sentence(
                f"Requests to {verb} the {obj} are approved by the {team} {role} after {event}, "
                f"as set out in {code}.",
                f"Who approves requests to {verb} the {obj}?",
                f"{team} {obj}",
            )
        elif form == 2:
            place = _PLACES[rng.integers(len(_PLACES))]
            disposal = _DISPOSALS[rng.integers(len(_DISPOSALS))]
            s = Sentence(
                f"In {place}, every {obj} of the {team} team is kept for {days} days and then "
                f"{disposal}, per {code}.",
                f"How long is every {obj} of the {team} team kept in {place}?",
                f"{team} {obj}",
            )
        else:
            condition = _CONDITIONS[rng.integers(len(_CONDITIONS))]
            s = Sentence(
                f"Under {code}, the {role} of the {team} team may {verb} the {obj} only when "
                f"{condition}.",
                f"When may the {team} {role} {verb} the {obj}?",
                f"{team} {obj}",
            )
        out.setdefault(s.text, s)
    return list(out.values())


@dataclass(frozen=True)
class Batch:
    documents: list[Document]
    encoded: Encoded


def batches(
    total_chunks: int,
    base: Sequence[Sentence],
    base_vectors: np.ndarray,
    base_tokens: Sequence[int],
    batch_chunks: int,
    seed: int = 0,
) -> Iterator[Batch]:
    """Documents of CHUNKS_PER_DOCUMENT chunks (the last may be shorter) until
    `total_chunks`, in batches of about `batch_chunks` chunks, deterministic for a seed.
    `base_tokens` are the sentences' word pieces: a chunk's count is the sum of its two, as
    ingest counts chunks by their sentences."""
    rng = np.random.default_rng(seed + 1)
    made = 0
    number = 0
    while made < total_chunks:
        documents: list[Document] = []
        chunks: list[Chunk] = []
        sentence_vectors: dict[str, bytes] = {}
        rows: list[np.ndarray] = []
        while made < total_chunks and len(chunks) < batch_chunks:
            count = min(CHUNKS_PER_DOCUMENT, total_chunks - made)
            first = rng.integers(0, len(base), count)
            second = rng.integers(0, len(base), count)
            weight = rng.uniform(0.5, 1.0, (count, 1)).astype(np.float32)
            mixed = weight * base_vectors[first] + (1 - weight) * base_vectors[second]
            mixed += rng.normal(0, NOISE, mixed.shape).astype(np.float32)
            rows.append(mixed / np.linalg.norm(mixed, axis=1, keepdims=True))
            doc_id = f"syn-{number:07d}"
            visibility = draw_visibility(rng)
            title = f"Handbook {number:07d}: {base[first[0]].topic}"
            texts = [f"{base[a].text} {base[b].text}" for a, b in zip(first, second, strict=True)]
            document = Document(
                doc_id, "1", title, f"bench://{doc_id}", "\n\n".join(texts), visibility
            )
            documents.append(document)
            for ordinal, (a, b) in enumerate(zip(first, second, strict=True)):
                chunk = Chunk(
                    chunk_id=chunk_id_for(doc_id, "1", ordinal),
                    doc_id=doc_id,
                    version="1",
                    ordinal=ordinal,
                    title=title,
                    uri=document.uri,
                    text=texts[ordinal],
                    token_count=int(base_tokens[a] + base_tokens[b]),
                    visibility=visibility,
                )
                chunks.append(chunk)
                sentence_vectors[chunk.scoped_id] = pack_vectors(base_vectors[[a, b]])
            made += count
            number += 1
        vectors = np.concatenate(rows).astype(np.float32)
        yield Batch(documents, Encoded(chunks, vectors, sentence_vectors))


def embed_sentences(embedder: Embedder, base: Sequence[Sentence]) -> tuple[np.ndarray, list[int]]:
    """The sentences' vectors and word-piece counts, by the real model."""
    vectors = embedder.embed([s.text for s in base], batch_size=64)
    return vectors, [embedder.count_tokens(s.text) for s in base]


def draw_visibility(rng: np.random.Generator) -> Visibility:
    """Tenant, region, ACL and dates of one benchmark document (module docstring)."""
    u = float(rng.random())
    share = next(s for s in LADDER if u < s)
    departments = tuple(f"group:dept-{d}" for d in rng.choice(40, rng.integers(0, 3), False))
    start = dt.date(2019, 1, 1) + dt.timedelta(days=int(rng.integers(0, 1400)))
    if u >= DECOY_FROM and rng.random() < DECOY_SHARE:
        acl = (f"group:{_ladder_group(LADDER[0])}", *departments)
        kind = int(rng.integers(4))
        if kind == 0:
            return Visibility("other-tenant", REGION, acl, start, None)
        if kind == 1:
            return Visibility(TENANT, "US", acl, start, None)
        if kind == 2:  # expired: ended before today
            return Visibility(TENANT, REGION, acl, start, dt.date(2024, 12, 31))
        return Visibility(TENANT, REGION, acl, dt.date(2031, 1, 1), None)  # not yet in force
    return Visibility(TENANT, REGION, (f"group:{_ladder_group(share)}", *departments), start, None)
