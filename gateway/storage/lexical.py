"""A Tantivy index: schema, writes, restricted BM25 search. The only module importing tantivy.

One `TantivyIndex` holds one tenant's chunks (`gateway.storage.partitions` keeps one per
tenant), so BM25's statistics (document frequencies, average length) are that tenant's.

User text never reaches Tantivy's query parser: it is analysed in Python with the same
analysers the index uses and turned into term queries, so no syntax character (`*`, `:`,
`(`, quotes) can cause an error or touch the restriction. The restriction is a Must clause
wrapped in a zero-score ConstScoreQuery, so it selects documents without changing BM25.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import tantivy
from tantivy import Filter, Occur, Query, TextAnalyzerBuilder, Tokenizer

from gateway.domain import Chunk, version_key
from gateway.restriction import Restriction, day_number
from gateway.storage.rows import ROW_FIELD, RowNames

PROSE = "prose"  # English words: lowercased, stop words dropped, stemmed
CODES = "codes"  # identifiers such as RPL-14 or CVE-2024-3094 kept whole
CODE_PATTERN = r"[A-Za-z0-9]+(?:[-_./#][A-Za-z0-9]+)*"
# An identifier has a digit and a letter or separator: RPL-14, CVE-2024-3094, A4, 2024-01-01.
# Plain words and plain numbers are left to the prose field.
_IDENTIFIER = re.compile(r"^(?=.*\d)(?=.*[a-z\-_./#]).+$")
CODE_BOOST = 3.0
MAX_QUERY_TERMS = 64  # a 2,000-character query still yields a bounded Boolean query
WRITER_HEAP = 64_000_000
TERM_SET_FROM = 200  # values from which one term-set query beats a term query each (measured)
# A date rule that keeps out at most this share of a partition's documents is a MustNot
# over the few it keeps out, read from the inverted index; a larger share, a Must read
# from the fast field. Measured on the 200k bench: with 4% kept out the MustNot took 0.06
# -0.3 ms less a search; with 14% the two were even; past that the fast field won.
EXCLUDED_BY_TERMS_UP_TO = 0.1
DAYS_BOUND = 2**31  # past any day number a date field holds (OPEN_END_DAY is 2,932,896)
FACTS_KEPT = 1024  # facts a partition's view keeps (as_of days x region sets), then anew


def _prose_analyzer() -> tantivy.TextAnalyzer:
    return (
        TextAnalyzerBuilder(Tokenizer.simple())
        .filter(Filter.remove_long(40))
        .filter(Filter.lowercase())
        .filter(Filter.stopword("english"))
        .filter(Filter.stemmer("english"))
        .build()
    )


def _codes_analyzer() -> tantivy.TextAnalyzer:
    return (
        TextAnalyzerBuilder(Tokenizer.regex(CODE_PATTERN))
        .filter(Filter.remove_long(64))
        .filter(Filter.lowercase())
        .build()
    )


def _schema(documents: bool = False, rows: bool = True) -> tantivy.Schema:
    """Chunks, or whole documents (one entry per version, ranked only: none of its text
    is shown, so none is stored, and its ID is that of the document's first chunk).

    A whole document's title is part of its text, as the document reads, not a boosted
    field of its own: a separate title field, scored with its own length norm and boosted,
    made whole-document BM25 worse on both evaluation sets (nDCG@10 SciFact train 0.648 vs
    0.700, SQuAD 0.887 vs 0.893), most where titles are long sentences."""
    b = tantivy.SchemaBuilder()
    stored = ("chunk_id",) if documents else StoredChunk._fields  # what a result shows
    for name in ("chunk_id", "doc_key", "doc_id", "version", "uri", "tenant", "region", "acl"):
        b.add_text_field(name, stored=name in stored, tokenizer_name="raw", index_option="basic")
    if not documents:
        b.add_text_field("title", stored=True, tokenizer_name=PROSE)
    b.add_text_field("text", stored=not documents, tokenizer_name=PROSE)
    b.add_text_field("codes", tokenizer_name=CODES, index_option="freq")
    b.add_integer_field("effective_from", indexed=True, fast=True)
    b.add_integer_field("effective_to", indexed=True, fast=True)
    if rows:  # False: written before rows were (docs/operations.md, "Upgrades and migrations")
        b.add_integer_field(ROW_FIELD, fast=True)
    return b.build()


class StoredChunk(NamedTuple):
    """What a result shows of a chunk, read from the same generation that ranked it."""

    chunk_id: str
    doc_id: str
    version: str
    title: str
    uri: str
    text: str


class LexicalHit(NamedTuple):  # tuples: hundreds are made per query, each at tuple cost
    chunk_id: str
    score: float
    # The best hits come with what a result shows of them: the lane reads their stored
    # document anyway, in its own thread while the query is still being embedded, so
    # the fetch after fusion only has to read the chunks this lane did not find.
    stored: StoredChunk | None = None


class _View:
    """A searcher and what is true of every document it holds, counted from it: the
    restriction drops a rule no document of the partition can fail. The facts belong to
    this searcher only; a commit makes a new view, so a search never pairs a searcher
    with facts counted on another."""

    def __init__(self, searcher: tantivy.Searcher) -> None:
        self.searcher = searcher
        self.documents = int(searcher.num_docs)
        self._counts: dict[object, int] = {}

    def count(self, key: object, query: tantivy.Query) -> int:
        """How many documents `query` matches; counted once per key and view."""
        known = self._counts.get(key)
        if known is None:
            found = self.searcher.search(query, 1, count=True)
            known = int(found.count)  # type: ignore[attr-defined]  # (not in the stub)
            if len(self._counts) >= FACTS_KEPT:  # as_of is the caller's: any day may come
                self._counts = {}
            self._counts[key] = known
        return known


class TantivyIndex:
    """One Tantivy index directory: one tenant's partition of one generation, of its
    chunks or (`documents`) of its whole documents."""

    def __init__(
        self,
        path: Path,
        documents: bool = False,
        previous: TantivyIndex | None = None,
        create: bool = True,
        rows: bool = True,
    ) -> None:
        """`previous`: the same partition in the generation before, whose row names this
        one takes where their files are the same (`RowNames`). Without `create` (a search
        or a warm opening what it found on disk) a directory that is gone raises: one
        removed meanwhile (a pruned generation, an erasure) is not made again, with the
        generation's directory above it and an empty index in it. `rows`: whether one made
        here numbers its rows; one on disk keeps the schema it has."""
        if create:
            path.mkdir(parents=True, exist_ok=True)
        elif not path.is_dir():
            raise FileNotFoundError(f"no partition directory {path.name}")
        self.path = path
        self._documents = documents
        before = previous._rows if previous is not None else None
        self._rows: RowNames | None = RowNames(path, before) if has_rows(path, rows) else None
        self._schema = _schema(documents, rows=self._rows is not None)
        self._index = tantivy.Index(self._schema, path=str(path), reuse=True)
        # Reloaded by hand after our own commits (`apply`): a generation's files change
        # under no one else. The default policy watches meta.json from a thread that, on
        # a change, reopens the index and so writes its lock file, also into a directory
        # that erasure or a test is removing at that moment ("Directory not empty").
        self._index.config_reader("Manual")
        self._prose = _prose_analyzer()
        self._codes = _codes_analyzer()
        self._index.register_tokenizer(PROSE, self._prose)
        self._index.register_tokenizer(CODES, self._codes)
        self._index.reload()
        self._view = _View(self._index.searcher())

    # -- writes -------------------------------------------------------------------------

    def apply(self, delete_doc_keys: Iterable[str], add: Sequence[Chunk]) -> None:
        """Delete whole document versions, add chunks, commit once (atomic in Tantivy)."""
        writer = self._index.writer(heap_size=WRITER_HEAP, num_threads=1)
        for key in delete_doc_keys:
            writer.delete_documents_by_term("doc_key", key)
        first = self._rows.assign([c.chunk_id for c in add]) if self._rows is not None else None
        for offset, chunk in enumerate(add):
            row = None if first is None else first + offset
            writer.add_document(_to_document(chunk, self._documents, row))
        writer.commit()
        writer.wait_merging_threads()
        self._index.reload()
        self._view = _View(self._index.searcher())

    # -- reads --------------------------------------------------------------------------

    def search(
        self, restriction: Restriction, text: str, limit: int, stored: int = 0
    ) -> list[LexicalHit]:
        """BM25 over the restricted universe; no hits for an empty restriction or query.
        The first `stored` hits carry their stored fields."""
        return self._restricted(restriction, self._match_query(text), limit, stored)

    def search_identifiers(
        self, restriction: Restriction, text: str, limit: int
    ) -> list[LexicalHit]:
        """Chunks containing identifiers the text names verbatim (RPL-14), by BM25 on them."""
        return self._restricted(restriction, self._identifier_query(text), limit)

    def identifiers(self, text: str) -> list[str]:
        return identifiers_in(text)

    def _restricted(
        self, restriction: Restriction, match: tantivy.Query | None, limit: int, stored: int = 0
    ) -> list[LexicalHit]:
        if restriction.is_empty or match is None:
            return []
        view = self._view
        query = Query.boolean_query(
            [
                (Occur.Must, Query.const_score_query(self._filter(restriction, view), 0.0)),
                (Occur.Must, match),
            ]
        )
        return self._collect(view, query, limit, stored)

    def filter_only(self, restriction: Restriction, limit: int = 1_000_000) -> set[str]:
        """Every chunk ID the restriction admits, unranked (used to test the filter)."""
        if restriction.is_empty:
            return set()
        view = self._view
        return {h.chunk_id for h in self._collect(view, self._filter(restriction, view), limit)}

    def fetch(self, restriction: Restriction, chunk_ids: Sequence[str]) -> dict[str, StoredChunk]:
        """Stored fields of the given chunks, still under the restriction."""
        if restriction.is_empty or not chunk_ids:
            return {}
        view = self._view
        query = Query.boolean_query(
            [
                (Occur.Must, self._any_of("chunk_id", chunk_ids)),
                (Occur.Must, self._filter(restriction, view)),
            ]
        )
        searcher = view.searcher
        found: dict[str, StoredChunk] = {}
        for _score, address in searcher.search(query, len(chunk_ids), count=False).hits:
            stored = _stored(searcher.doc(address))
            found[stored.chunk_id] = stored
        return found

    def count(self) -> int:
        return self._view.documents

    def names_more_than_it_holds(self) -> bool:
        """Whether its rows files name chunks it no longer holds (gateway/storage/rows.py)."""
        return self._rows is not None and len(self._rows) > self.count()

    def stored_chunks(self) -> Iterable[StoredChunk]:
        """Every chunk of a chunk partition, as stored."""
        searcher = self._view.searcher
        every = Query.all_query()
        for _score, address in searcher.search(every, max(1, searcher.num_docs)).hits:
            yield _stored(searcher.doc(address))

    def _collect(
        self, view: _View, query: tantivy.Query, limit: int, stored: int = 0
    ) -> list[LexicalHit]:
        """The top hits; the first `stored` with their stored fields, the others named by
        their row (`gateway.storage.rows`), or from the store where no row names them."""
        searcher = view.searcher
        found = searcher.search(query, limit, count=False).hits
        named = self._named(searcher, [address for _score, address in found[stored:]])
        hits = []
        for rank, (score, address) in enumerate(found):
            if rank < stored:
                fields = _stored(searcher.doc(address))
                hits.append(LexicalHit(fields.chunk_id, float(score), fields))
                continue
            chunk_id = named[rank - stored]
            if chunk_id is None:
                chunk_id = str(searcher.doc(address).get_first("chunk_id"))
            hits.append(LexicalHit(chunk_id, float(score)))
        return hits

    def _named(
        self, searcher: tantivy.Searcher, addresses: list[tantivy.DocAddress]
    ) -> list[str | None]:
        if self._rows is None or not addresses:
            return [None] * len(addresses)
        rows = searcher.fast_field_values(ROW_FIELD, addresses)
        return [self._rows.name(row) for row in rows]

    def _filter(self, r: Restriction, view: _View) -> tantivy.Query:
        """The restriction as Tantivy clauses, less the rules no document of the view can
        fail: a region rule where all its documents are in the caller's regions, a date
        rule where all are in force on that side of `as_of` (most corpora: no start in
        the future, nothing ended). Each rule dropped is one intersection fewer for every
        document the search walks (0.2-0.4 ms each at 200k chunks)."""
        s = self._schema
        clauses = [(Occur.Must, Query.term_query(s, "tenant", r.tenant))]
        regions = sorted(r.regions)
        in_regions = self._any_of("region", regions)
        if view.count(("regions", r.regions), in_regions) < view.documents:
            clauses.append((Occur.Must, in_regions))
        clauses.append((Occur.Must, self._any_of("acl", sorted(r.principals))))
        as_of = day_number(r.as_of)
        starts_later = _int_range(s, "effective_from", as_of + 1, None, inverted=True)
        ended_before = _int_range(s, "effective_to", None, as_of - 1, inverted=True)
        started = _int_range(s, "effective_from", None, as_of)
        not_ended = _int_range(s, "effective_to", as_of, None)
        for field, outside, inside in (
            ("effective_from", starts_later, started),
            ("effective_to", ended_before, not_ended),
        ):
            # Every document is written with both dates (`_fields`); one without a value
            # (or with one no day can have) would pass a rule dropped or a MustNot, so such
            # a partition keeps the Must. (A range, not `exists_query`: in every tantivy-py
            # this project allows.)
            any_day = _int_range(s, field, -DAYS_BOUND, DAYS_BOUND, inverted=True)
            if view.count(("dated", field), any_day) < view.documents:
                clauses.append((Occur.Must, inside))
                continue
            kept_out = view.count((field, as_of), outside)
            if kept_out > EXCLUDED_BY_TERMS_UP_TO * view.documents:
                clauses.append((Occur.Must, inside))
            elif kept_out:
                clauses.append((Occur.MustNot, outside))
        return Query.boolean_query(clauses)

    def _any_of(self, field: str, values: Sequence[str]) -> tantivy.Query:
        """Documents with any of the values. A term-set query builds an automaton per query
        (0.28 ms measured here even for one value, on every search and fetch); a few term
        queries cost next to nothing, so the automaton is kept for long lists only; one
        value is its term query alone (a Boolean query of one clause still walks as a
        union: 0.2 ms more for the region rule on the 200k bench)."""
        if len(values) == 1:
            return Query.term_query(self._schema, field, values[0])
        if len(values) > TERM_SET_FROM:
            return Query.term_set_query(self._schema, field, list(values))
        return Query.boolean_query(
            [(Occur.Should, Query.term_query(self._schema, field, v)) for v in values]
        )

    def _match_query(self, text: str) -> tantivy.Query | None:
        s = self._schema
        clauses: list[tuple[tantivy.Occur, tantivy.Query]] = []
        prose = list(dict.fromkeys(self._prose.analyze(text)))[:MAX_QUERY_TERMS]
        for term in prose:
            clauses.append((Occur.Should, Query.term_query(s, "text", term)))
            if not self._documents:  # (a whole document's title is in its text)
                # Not boosted: a title word counts as a body word. Boosted 2x, as before,
                # the BM25 lane alone scored SciFact train nDCG@10 0.617 against 0.649
                # (SQuAD 0.882 against 0.884): long titles outweighed the passage.
                clauses.append((Occur.Should, Query.term_query(s, "title", term)))
        identifiers = self._identifier_query(text)
        if identifiers is not None:
            clauses.append((Occur.Should, Query.boost_query(identifiers, CODE_BOOST)))
        return Query.boolean_query(clauses) if clauses else None

    def _identifier_query(self, text: str) -> tantivy.Query | None:
        terms = self.identifiers(text)
        if not terms:
            return None
        return Query.boolean_query(
            [(Occur.Should, Query.term_query(self._schema, "codes", t)) for t in terms]
        )


@functools.cache
def _shared_codes() -> tantivy.TextAnalyzer:
    return _codes_analyzer()


def identifiers_in(text: str) -> list[str]:
    """The identifiers a text names verbatim (RPL-14), as the codes field indexes them."""
    tokens = dict.fromkeys(_shared_codes().analyze(text))
    return [t for t in tokens if _IDENTIFIER.match(t)][:MAX_QUERY_TERMS]


def _stored(doc: tantivy.Document) -> StoredChunk:
    get = doc.get_first
    return StoredChunk._make([str(get(name) or "") for name in StoredChunk._fields])


def _int_range(
    schema: tantivy.Schema, field: str, lower: int | None, upper: int | None, inverted: bool = False
) -> tantivy.Query:
    # Read from the fast field unless `inverted`: through the inverted index, a range
    # nearly every chunk falls in first builds a bitset of the whole index. Same hits,
    # measured on 200k synthetic chunks: the restricted BM25 query 6.1 -> 4.2 ms at 1%
    # visible, 9.0 -> 8.2 ms at 10%. A range few chunks fall in (those out of force) is
    # the other way round: its bitset is small, and cheaper than reading the fast field.
    return Query.range_query(
        schema, field, tantivy.FieldType.Integer, lower, upper, use_inverted_index=inverted
    )


def _to_document(chunk: Chunk, whole: bool, row: int | None) -> tantivy.Document:
    text = f"{chunk.title}\n{chunk.text}"  # the identifiers of both; a whole document's words
    fields = _fields(chunk) if row is None else {**_fields(chunk), ROW_FIELD: row}
    if not whole:
        return tantivy.Document(**fields, title=chunk.title, text=chunk.text, codes=text)
    return tantivy.Document(**fields, text=text, codes=text)


def has_rows(path: Path, new: bool = True) -> bool:
    """Whether the partition at `path` numbers its rows: a new one as `new` says; one
    written before rows were keeps the schema it has (Tantivy opens an index only with its
    own)."""
    try:
        meta = json.loads((path / "meta.json").read_text())
    except FileNotFoundError:
        return new
    return any(field.get("name") == ROW_FIELD for field in meta.get("schema", ()))


def _fields(chunk: Chunk) -> dict[str, object]:
    """The fields a chunk and a whole document share: identity, restriction, validity."""
    v = chunk.visibility
    return dict(
        chunk_id=chunk.chunk_id,
        doc_key=version_key(v.tenant, chunk.doc_id, chunk.version),
        doc_id=chunk.doc_id,
        version=chunk.version,
        uri=chunk.uri,
        tenant=v.tenant,
        region=v.region,
        acl=list(v.acl),
        effective_from=day_number(v.effective_from),
        effective_to=day_number(v.effective_to),
    )
