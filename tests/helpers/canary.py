"""Canary documents and the scans that prove an erasure: words that occur nowhere else,
looked for with each engine's own reader and in the raw bytes of every file and object."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import lancedb
import numpy as np
import pyarrow.fs as pafs
import tantivy

from gateway.domain import split_version_key
from gateway.storage.lexical import _codes_analyzer, _prose_analyzer
from gateway.storage.objects import ObjectStore

# Words no corpus of the tests has; each analyses to itself.
CANARY_WORDS = ("blintharp", "zuvomeck", "wexlomir", "gravendoth", "plumquassit")


def canary_doc(n: int, **fields: Any) -> dict[str, Any]:
    """A pushable document whose title and text are canary words only."""
    word = CANARY_WORDS[n % len(CANARY_WORDS)]
    others = " ".join(CANARY_WORDS)
    return {
        "doc_id": f"canary-{n}",
        "version": "1",
        "title": f"The {word} dossier",
        "text": f"Every {word} and {others} rests in vault {n}. " * 3,
        "region": "EU",
        "acl": ["group:staff"],
        "effective_from": "2020-01-01",
        **fields,
    }


@dataclass
class Findings:
    tantivy: list[str]
    lance: list[str]
    files: list[str]
    objects: list[str]

    @property
    def empty(self) -> bool:
        return not (self.tantivy or self.lance or self.files or self.objects)


def _terms() -> dict[str, set[str]]:
    prose = {t for w in CANARY_WORDS for t in _prose_analyzer().analyze(w)}
    codes = {t for w in CANARY_WORDS for t in _codes_analyzer().analyze(w)}
    return {"text": prose, "title": prose, "codes": codes}


def tantivy_findings(root: Path) -> list[str]:
    """Every canary term with a document frequency above 0 in any Tantivy index under
    `root` (a frequency counts documents only marked deleted)."""
    found = []
    for meta in sorted(root.rglob("meta.json")):
        fields = {f["name"] for f in json.loads(meta.read_text()).get("schema", [])}
        if "chunk_id" not in fields:
            continue  # not one of ours (LanceDB has no meta.json; guard anyway)
        searcher = tantivy.Index.open(str(meta.parent)).searcher()
        for field, terms in _terms().items():
            if field not in fields:
                continue
            for term in sorted(terms):
                if searcher.doc_freq(field, term) > 0:
                    found.append(f"{meta.parent.relative_to(root)} {field}:{term}")
    return found


def lance_findings(uri: str, options: dict[str, str] | None, doc_ids: list[str]) -> list[str]:
    """Canary rows in any version of any table of the LanceDB database at `uri`."""
    db = lancedb.connect(uri, storage_options=options)
    found = []
    for name in db.list_tables().tables:
        try:
            table = db.open_table(name)
        except ValueError:  # a store listing a dropped table's empty directory
            continue
        for version in sorted(int(v["version"]) for v in table.list_versions()):
            table.checkout(version)
            keys = table.search().select(["doc_key"]).limit(None).to_arrow()
            hits = [
                k for k in keys.column("doc_key").to_pylist() if split_version_key(k)[1] in doc_ids
            ]
            if hits:
                found.append(f"{name} v{version}: {len(hits)} rows")
    return found


def canary_vectors(
    uri: str, options: dict[str, str] | None, doc_ids: list[str]
) -> list[np.ndarray]:
    """The vectors of the canary documents' chunks, read before they are deleted."""
    db = lancedb.connect(uri, storage_options=options)
    out = []
    for name in db.list_tables().tables:
        rows = db.open_table(name).search().select(["doc_key", "vector"]).limit(None).to_arrow()
        for key, vector in zip(
            rows.column("doc_key").to_pylist(), rows.column("vector").to_pylist(), strict=True
        ):
            if split_version_key(key)[1] in doc_ids:
                out.append(np.asarray(vector, dtype=np.float32))
    return out


def needles(vectors: list[np.ndarray]) -> list[bytes]:
    """What to look for in raw bytes: each canary word, and the float32 bytes of the
    start of each canary vector."""
    words = [w.encode() for w in CANARY_WORDS]
    return words + [v.astype(np.float32).tobytes()[:48] for v in vectors]


def file_findings(root: Path, wanted: list[bytes]) -> list[str]:
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for needle in wanted:
            if needle in data:
                found.append(f"{path.relative_to(root)}: {needle[:16]!r}")
                break
    return found


def object_findings(store: ObjectStore, wanted: list[bytes]) -> list[str]:
    """Every object under the store's prefix (Tantivy generations, LanceDB's files) whose
    bytes hold a needle."""
    parts = urlsplit(store.endpoint)
    fs = pafs.S3FileSystem(
        access_key=store.access_key,
        secret_key=store.secret_key,
        region=store.region,
        endpoint_override=parts.netloc,
        scheme=parts.scheme,
    )
    root = f"{store.bucket}/{store.prefix}"
    listing = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True, recursive=True))
    found = []
    for info in listing:
        if info.type != pafs.FileType.File:
            continue
        with fs.open_input_stream(info.path) as source:
            data = source.read()
        if any(needle in data for needle in wanted):
            found.append(info.path[len(root) :])
    return found


def scan(
    root: Path,
    doc_ids: list[str],
    vectors: list[np.ndarray],
    *,
    store: ObjectStore | None = None,
) -> Findings:
    """Every scan over one data dir, and its vector database (the store's when given)."""
    wanted = needles(vectors)
    if store is not None:
        lance = lance_findings(store.vectors_uri, store.lance_options, doc_ids)
        objects = object_findings(store, wanted)
    else:
        local = root / "vectors"
        lance = lance_findings(str(local), None, doc_ids) if local.exists() else []
        objects = []
    return Findings(tantivy_findings(root), lance, file_findings(root, wanted), objects)
