"""What a search shows: the lanes' rankings fused, by chunk or by document, and each shown
hit with its stored fields, from the lane that brought them or else read from the index
under the request's restriction."""

from __future__ import annotations

from typing import Literal, NamedTuple

from gateway.errors import GatewayError
from gateway.policy.model import Policy
from gateway.restriction import Restriction
from gateway.retrieval.documents import fuse_documents
from gateway.retrieval.fuse import FusedHit, Ranking, fusion
from gateway.retrieval.lanes.base import LaneResult
from gateway.retrieval.scope import RequestScope
from gateway.storage.layout import ServedIndex
from gateway.storage.lexical import StoredChunk
from gateway.storage.partitions import GenerationRemoved
from gateway.uris import shown_uri

GroupBy = Literal["chunk", "document"]
TRACED_IDS = 10  # IDs per stage span: enough to explain a ranking, small enough to ship


class SearchHit(NamedTuple):  # a tuple: up to 100 are made per request, each at tuple cost
    chunk_id: str
    doc_id: str
    version: str
    title: str
    uri: str
    score: float
    text: str
    lanes: dict[str, int | None]
    # Set on context the expand stage added: the retrieved chunk this one stands beside.
    expanded_from: str | None = None
    # Word pieces of `text` as counted at ingest, once the expand stage has read them.
    tokens: int | None = None

    @property
    def retrieved_as(self) -> str:
        """The retrieved chunk this hit is, or extends."""
        return self.expanded_from or self.chunk_id


def fuse_and_fetch(
    scope: RequestScope,
    restriction: Restriction,
    answered: dict[str, LaneResult],
    names: list[str],
    group_by: GroupBy,
) -> list[SearchHit]:
    """The `fuse` stage: the answered lanes' rankings fused (`names` orders each hit's
    lanes), the top `scope.top_k` shown with their stored fields; recorded on the
    scope's clock."""
    settings = scope.policy.retrieval
    stage = scope.clock.stage("fuse", mode=settings.fusion, k=settings.rrf_k, group_by=group_by)
    with stage as info:
        fused = fuse(answered, names, scope.policy, scope.top_k, group_by)
        stored, fetched = _stored_fields(fused, answered, scope.index, restriction)
        hits = [
            SearchHit(
                chunk_id=h.chunk_id,
                doc_id=s.doc_id,
                version=s.version,
                title=s.title,
                uri=shown_uri(s.uri),  # one stored before ingest refused its scheme: ""
                score=h.score,
                text=s.text,
                lanes=h.ranks,
            )
            for h in fused
            if (s := stored.get(h.chunk_id)) is not None
        ]
        info.update(
            candidates=len(fused),
            fetched=fetched,
            returned=len(hits),
            chunk_ids=[h.chunk_id for h in hits[:TRACED_IDS]],
            scores=[round(h.score, 6) for h in hits[:TRACED_IDS]],
        )
    return hits


def fuse(
    answered: dict[str, LaneResult],
    names: list[str],
    policy: Policy,
    top_k: int,
    group_by: GroupBy,
) -> list[FusedHit]:
    """The top `top_k` chunks by `retrieval.fusion`, or, grouping by document, the top
    documents (`fuse_documents`), each named by the chunk that shows it."""
    settings = policy.retrieval
    rankings = {name: Ranking(r.chunk_ids, r.scores) for name, r in answered.items()}
    chunks = fusion(rankings, settings.fusion, settings.rrf_k, settings.weights)
    if group_by == "document":
        whole = {
            name: Ranking(*r.documents) for name, r in answered.items() if r.documents is not None
        }
        return fuse_documents(rankings, chunks.order, policy, names, top_k, whole)
    return chunks.hits(names, top_k)


def _stored_fields(
    fused: list[FusedHit],
    answered: dict[str, LaneResult],
    index: ServedIndex,
    restriction: Restriction,
) -> tuple[dict[str, StoredChunk], int]:
    """The stored fields of the fused chunks, and how many had to be read: the lanes
    brought some; the rest are read under the same restriction, so that nothing it does
    not admit is shown."""
    stored = {c: f for lane in answered.values() for c, f in lane.stored.items()}
    missing = [h.chunk_id for h in fused if h.chunk_id not in stored]
    try:
        if missing:
            stored.update(index.lexical.fetch(restriction, missing))
    except GenerationRemoved:  # what was found can't be shown: a retry reads the new one
        raise GatewayError("not_ready", "the index generation read was replaced; retry") from None
    return stored, len(missing)
