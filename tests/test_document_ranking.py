"""Ranking documents from chunks (`retrieval.document_ranking`): orderings on hand-made
rankings, the same documents in every mode, and restriction kept through the real path."""

from __future__ import annotations

import asyncio
import datetime as dt
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from gateway.api.app import create_app
from gateway.domain import Caller, Chunk, Document, Visibility, document_of, version_key
from gateway.embedding import Embedder
from gateway.ingest.chunk import ChunkingOptions, chunk_document
from gateway.ingest.pipeline import ingest_documents
from gateway.policy.loader import DEFAULT_POLICY_DIR
from gateway.policy.model import Policy, Retrieval
from gateway.restriction import Restriction, visible
from gateway.retrieval.documents import fuse_documents, rank_documents
from gateway.retrieval.fuse import Ranking
from gateway.retrieval.lanes.bm25 import Bm25Lane
from gateway.retrieval.scope import RequestScope
from gateway.retrieval.search import HybridSearcher, today_utc
from gateway.storage.catalog import Catalog
from gateway.storage.flat import FlatVectors
from gateway.storage.layout import DataLayout, ServedIndex, open_served
from gateway.storage.lexical import TantivyIndex
from gateway.storage.partitions import DOCUMENTS_PREFIX, LexicalIndex, partition_name
from gateway.storage.vectors import VectorStore
from gateway.storage.whole import _without_overlap, whole_documents
from gateway.telemetry.stages import StageClock
from tests.helpers.callers import ALICE
from tests.helpers.identity import TokenFactory, bearer, make_settings

MODES = ("best_chunk", "decayed_sum", "rrf_sum", "layered")


def ranked(mode: str, chunks: list[tuple[str, float]], **settings: float) -> list[str]:
    """Document order of one lane whose chunks `(doc:n, score)` come best first."""
    ranking = Ranking([c for c, _ in chunks], [s for _, s in chunks])
    document = {c: c.split(":")[0] for c, _ in chunks}
    retrieval = Retrieval(document_ranking=mode, **settings)  # type: ignore[arg-type]
    return list(rank_documents(ranking, document, retrieval).ids)


# a:0 is the single best chunk; b has three good ones.
LANE = [("a:0", 10.0), ("b:0", 9.0), ("b:1", 8.5), ("b:2", 8.0), ("c:0", 5.0), ("a:1", 1.0)]


def test_best_chunk_ranks_a_document_where_its_best_chunk_ranks() -> None:
    assert ranked("best_chunk", LANE) == ["a", "b", "c"]


@pytest.mark.parametrize("mode", ["decayed_sum", "rrf_sum"])
def test_a_sum_lifts_the_document_that_several_passages_match(mode: str) -> None:
    assert ranked(mode, LANE) == ["b", "a", "c"]
    # Counting only each document's best chunk is the best-chunk order again.
    assert ranked(mode, LANE, document_chunks=1) == ["a", "b", "c"]


def test_the_decay_weighs_each_further_chunk_less() -> None:
    # Normalised: a 1.0 + d*0.0; b 0.889 + d*0.833 + d^2*0.778; c 0.444.
    assert ranked("decayed_sum", LANE, document_decay=0.1) == ["a", "b", "c"]
    assert ranked("decayed_sum", LANE, document_decay=0.5) == ["b", "a", "c"]


def test_layered_counts_only_the_chunks_both_lanes_found() -> None:
    ranking = Ranking([c for c, _ in LANE], [s for _, s in LANE])
    document = {c: c.split(":")[0] for c, _ in LANE}
    layered = Retrieval(document_ranking="layered")
    # c:0 and a:1 were found by both lanes: c ranks first (its chunk ranks higher), b
    # (no such chunk) last; with no agreement known, every chunk counts (rrf_sum).
    assert rank_documents(ranking, document, layered, {"c:0", "a:1"}).ids == ["c", "a", "b"]
    assert rank_documents(ranking, document, layered, None).ids == ranked("rrf_sum", LANE)


def test_a_negative_score_scale_does_not_matter_to_decayed_sum() -> None:
    shifted = [(c, s - 100.0) for c, s in LANE]
    assert ranked("decayed_sum", shifted) == ranked("decayed_sum", LANE)


chunk_lists = st.lists(
    st.tuples(st.sampled_from("abcdef"), st.floats(-5, 5, allow_nan=False)),
    min_size=0,
    max_size=30,
)


@given(chunks=chunk_lists, mode=st.sampled_from(MODES))
def test_every_mode_ranks_exactly_the_documents_the_lane_found(
    chunks: list[tuple[str, float]], mode: str
) -> None:
    ordered = sorted(chunks, key=lambda c: -c[1])
    lane = [(f"{doc}:{i}", score) for i, (doc, score) in enumerate(ordered)]
    documents = ranked(mode, lane)
    assert sorted(documents) == sorted({doc for doc, _ in chunks})  # none added or lost


@pytest.mark.parametrize(
    "mode",
    [
        {"document_ranking": "decayed_sum"},
        {"document_ranking": "rrf_sum"},
        {"document_ranking": "layered"},
        {"document_bm25": True, "document_vector": "mean"},
        {"document_bm25": True, "document_vector": "first"},
    ],
)
def test_search_by_document_stays_inside_the_callers_universe(
    mode: dict[str, object],
    tmp_path: Path,
    data_dir: Path,
    jwks_file: Path,
    embedder: Embedder,
    make_token: TokenFactory,
) -> None:
    policy = yaml.safe_load((DEFAULT_POLICY_DIR / "policy.yaml").read_text())
    policy["retrieval"].update(mode)
    # Every lane must answer for its universe to be checked: a first dense search (its
    # document sums made) on a machine busy with other tests once took past 800 ms, and
    # the search answered degraded with nothing to check.
    policy["budgets"].update(bm25_ms=30_000, dense_ms=30_000, exact_ms=30_000)
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    catalog = Catalog(data_dir / "catalog.db")
    restriction = Restriction("acme", frozenset({"user:alice", "group:staff"}),
                              frozenset({"EU"}), today_utc())  # fmt: skip
    with TestClient(create_app(make_settings(data_dir, jwks_file, tmp_path), embedder)) as client:
        served = client.app.state.gateway.indexes._served  # type: ignore[attr-defined]
        by_vector = mode.get("document_vector", "off") != "off"
        assert (served.flat._documents_made is not None) == by_vector  # made by the warm
        for query in ("chargeback thresholds merchant fraud", "refunds", "board minutes"):
            body = {"query": query, "top_k": 100, "group_by": "document"}
            found = client.post("/search", json=body, headers=bearer(make_token(**ALICE)))
            assert found.status_code == 200, found.text  # (503 lanes_unavailable: rerun)
            assert found.json()["degraded"] == []
            results = found.json()["results"]
            assert results and len({r["doc_id"] for r in results}) == len(results)
            for result in results:
                versions = catalog.visibility_of("acme", result["doc_id"], result["version"])
                assert all(visible(restriction, v) for _, v in versions), result["doc_id"]


# -- BM25 over whole documents (`retrieval.document_bm25`) -----------------------------

SENTENCES = [f"Sentence number {n} talks about topic {n} at some length today." for n in range(14)]
WORDS = ChunkingOptions(max_tokens=32, overlap_tokens=12)


def words(text: str) -> int:
    return len(text.split())


def document(doc_id: str, text: str, acl: str = "group:staff", tenant: str = "acme") -> Document:
    seen = Visibility(tenant, "EU", (acl,), dt.date(2020, 1, 1), None)
    return Document(doc_id, "1", doc_id.title(), "", text, seen)


def test_a_whole_document_holds_each_sentence_once_despite_chunk_overlaps() -> None:
    chunks = chunk_document(document("long", " ".join(SENTENCES)), words, WORDS)
    assert len(chunks) > 3 and chunks[1].text.startswith(chunks[0].text.split(". ")[-1][:20])
    [whole] = whole_documents(reversed(chunks))  # any order in: by ordinal out
    assert whole.text == " ".join(SENTENCES)
    assert whole.chunk_id == chunks[0].chunk_id and whole.visibility == chunks[0].visibility


# "spread" names both query terms, in different chunks; "dense" names one, twice, in a
# short chunk: its best chunk beats any chunk of "spread", the whole of it does not.
SPREAD = " ".join(["Zebra herds cross the plain."] + SENTENCES[:8] + ["Quartz lies under it."])
DENSE = "Zebra zebra. " + " ".join(SENTENCES[8:12])


def served(root: Path, embedder: Embedder, documents: list[Document]) -> ServedIndex:
    layout = DataLayout(root)
    ingest_documents(documents, layout, embedder, WORDS)
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None
    return index


def bm25_documents(index: ServedIndex, whole: bool, caller: Caller) -> list[str]:
    policy = Policy()
    retrieval = policy.retrieval.model_copy(update={"document_bm25": whole})
    policy = policy.model_copy(update={"retrieval": retrieval})
    searcher = HybridSearcher([Bm25Lane()], 1, 1)
    try:
        scope = RequestScope(index, policy, caller, "zebra quartz", 10, StageClock())
        outcome = asyncio.run(searcher.search(scope, "document"))
    finally:
        searcher.close()
    return [h.doc_id for h in outcome.hits]


STAFF = Caller("alice", "acme", "EU", frozenset({"group:staff"}), frozenset({"EU"}))


def test_whole_document_bm25_ranks_the_document_that_names_every_term_first(
    tmp_path: Path, embedder: Embedder
) -> None:
    index = served(tmp_path, embedder, [document("spread", SPREAD), document("dense", DENSE)])
    assert bm25_documents(index, whole=False, caller=STAFF) == ["dense", "spread"]
    assert bm25_documents(index, whole=True, caller=STAFF) == ["spread", "dense"]


def test_a_title_word_weighs_in_a_whole_document_what_a_body_word_does(
    tmp_path: Path, embedder: Embedder
) -> None:
    # "zebra" names it only in its title, "stripes" once in its body; both have one
    # title word and the same body length, so whole-document BM25 scores them alike.
    body = "Quartz lies under the plain where herds graze at dawn."
    named = document("zebra", body)
    inside = document("stripes", body.replace("Quartz", "Zebra"))
    index = served(tmp_path, embedder, [named, inside])
    found = index.lexical.search_documents(Restriction.for_caller(STAFF, today_utc()), "zebra", 5)
    assert found is not None
    assert sorted(document_of(h.chunk_id) for h in found) == ["stripes", "zebra"]
    assert found[0].score == pytest.approx(found[1].score)


def test_an_index_of_an_earlier_release_gets_its_documents_at_the_next_write(
    tmp_path: Path, embedder: Embedder
) -> None:
    index = served(
        tmp_path, embedder, [document("spread", SPREAD), document("dense", DENSE, "group:hr")]
    )
    for written in index.lexical.path.glob(f"{DOCUMENTS_PREFIX}*"):  # as an earlier
        if written.is_dir():  # release wrote it: no document partitions, no digests
            shutil.rmtree(written)
        else:
            written.unlink()
    index = served(tmp_path, embedder, [])
    restriction = Restriction.for_caller(STAFF, today_utc())
    assert index.lexical.search_documents(restriction, "zebra", 5) is None
    # Without a document index the lane votes from its chunks, as before.
    assert bm25_documents(index, whole=True, caller=STAFF) == ["spread"]

    index = served(tmp_path, embedder, [document("other", "Zebra crossing rules.")])
    found = index.lexical.search_documents(restriction, "zebra quartz", 10)
    assert found is not None and [document_of(h.chunk_id) for h in found] == ["spread", "other"]
    hr = Caller("bob", "acme", "EU", frozenset({"group:hr"}), frozenset({"EU"}))
    assert bm25_documents(index, whole=True, caller=hr) == ["dense"]  # its own ACL kept


def test_documents_behind_their_chunks_are_not_used_and_are_rebuilt_at_the_next_write(
    tmp_path: Path, embedder: Embedder
) -> None:
    index = served(tmp_path, embedder, [document("spread", SPREAD), document("dense", DENSE)])
    restriction = Restriction.for_caller(STAFF, today_utc())
    # A writer of an earlier release deletes "spread" from the chunk partition only.
    chunks = TantivyIndex(index.lexical.path / partition_name("acme"))
    chunks.apply([version_key("acme", "spread", "1")], [])
    reopened = LexicalIndex(index.lexical.path)
    assert reopened.search_documents(restriction, "zebra quartz", 10) is None
    assert reopened.search(restriction, "zebra quartz", 10)  # chunks still serve

    index = served(tmp_path, embedder, [document("other", "Zebra crossing rules.")])
    found = index.lexical.search_documents(restriction, "zebra quartz", 10)
    assert found is not None
    assert sorted(document_of(h.chunk_id) for h in found) == ["dense", "other"]


def test_document_vectors_score_as_the_mean_or_the_first_chunk_vector(tmp_path: Path) -> None:
    """Against numpy on the vectors themselves: chunks of three documents (one of another
    tenant, with the same doc ID) stored out of order, one document not permitted."""
    rng = np.random.default_rng(7)
    staff = Visibility("acme", "EU", ("group:staff",), dt.date(2020, 1, 1), None)
    hr = Visibility("acme", "EU", ("group:hr",), dt.date(2020, 1, 1), None)
    other = Visibility("globex", "EU", ("group:staff",), dt.date(2020, 1, 1), None)
    layout = [("a", staff, 3), ("b", staff, 1), ("c", hr, 2), ("a", other, 2), ("d", staff, 4)]
    chunks = [
        Chunk(f"{doc}@1:{n}", doc, "1", n, "", "", "x", 1, seen)
        for doc, seen, count in layout
        for n in range(count)
    ]
    order = rng.permutation(len(chunks))
    chunks = [chunks[i] for i in order]
    vectors = rng.normal(size=(len(chunks), 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = VectorStore(tmp_path / "vectors", dim=8)
    store.apply([], chunks, vectors, {})
    flat = FlatVectors.build(store.snapshot())
    asker = Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), dt.date(2024, 1, 1))
    query = rng.normal(size=8).astype(np.float32)
    unit = query / np.linalg.norm(query)
    rows = flat.permitted_rows(asker)

    def vectors_of(doc: str) -> np.ndarray:
        mine = [i for i, c in enumerate(chunks) if c.doc_id == doc and c.visibility == staff]
        return vectors[sorted(mine, key=lambda i: chunks[i].ordinal)]

    mean = {d: float(v.sum(0) @ unit / np.linalg.norm(v.sum(0))) for d in "abd"
            if (v := vectors_of(d)).size}  # fmt: skip
    first = {d: float(vectors_of(d)[0] @ unit) for d in "abd"}
    for kind, expected in (("mean", mean), ("first", first)):
        hits = flat.search_documents(rows, query, 10, kind)
        assert [h.chunk_id for h in hits] == [
            f"{d}@1:0" for d in sorted(expected, key=lambda d: -expected[d])
        ]
        for hit in hits:
            assert 1.0 - hit.distance == pytest.approx(expected[hit.chunk_id[0]], abs=1e-5)
    assert len(flat.search_documents(rows, query, 2, "mean")) == 2


def test_only_repeated_whole_sentences_are_taken_as_overlap() -> None:
    assert _without_overlap("One. Two three.", "Two three. Four.") == "Four."
    # A word that merely begins like the previous chunk's end, or a number after a
    # sentence, is the chunk's own text.
    assert _without_overlap("Call the API", "APIs are great.") == "APIs are great."
    assert _without_overlap("x. The", "Theory says.") == "Theory says."
    assert _without_overlap("A b. Table 2.", "2. Methods x.") == "2. Methods x."


def test_two_versions_in_force_give_their_document_one_vote() -> None:
    chunks = {"bm25": Ranking(["a@1:0", "b@1:0"], [2.0, 1.0]), "dense": Ranking([], [])}
    whole = {"bm25": Ranking(["b@2:0", "b@1:0", "a@1:0"], [3.0, 2.5, 2.0])}
    lanes = ["bm25", "dense"]
    documents = fuse_documents(chunks, ["a@1:0", "b@1:0"], Policy(), lanes, None, whole)
    assert [h.chunk_id.split("@")[0] for h in documents] == ["b", "a"]
    assert [h.score for h in documents] == [1.0, 0.0]  # b once, by its best (not 1.5)
