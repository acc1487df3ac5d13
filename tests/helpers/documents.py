"""Documents the tests ingest or push: the shared corpus, single documents, batches, digests."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

from gateway.embedding import Embedder
from gateway.ingest.pipeline import (
    ingest_paths,
)
from gateway.restriction import Restriction
from gateway.storage.layout import (
    DataLayout,
)

SECRET = "SEC-4711"


# Real paragraphs, shipped with the tests (CC BY-SA 4.0; tests/data/squad2-dev-slice/README.md).
SQUAD_SLICE = Path(__file__).parent.parent / "data" / "squad2-dev-slice" / "passages.jsonl"


TODAY = dt.datetime.now(dt.UTC).date()


def day(offset: int) -> str:
    return (TODAY + dt.timedelta(days=offset)).isoformat()


def write(path: Path, content: str) -> Path:
    """`content` as the UTF-8 file `path`, its folders made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    return path


def write_doc(root: Path, name: str, meta: dict[str, Any], body: str) -> Path:
    lines = ["---"]
    for key, value in meta.items():
        lines.append(f"{key}: {json.dumps(value)}")
    lines += ["---", body, ""]
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


STAFF_EU = {"tenant": "acme", "region": "EU", "acl": ["group:staff"]}


# (file, front matter, body). Codes are unique strings a leak would reveal.
CORPUS: list[tuple[str, dict[str, Any], str]] = [
    (
        "refund-v1.md",
        {
            "doc_id": "refund-policy",
            "version": "1",
            "title": "Refund policy",
            **STAFF_EU,
            "effective_from": "2020-01-01",
        },
        "# Refund policy\n\nRefunds are paid within 30 days under rule OLDV-1001. "
        "Customers must keep the receipt.",
    ),
    (
        "refund-v2.md",
        {
            "doc_id": "refund-policy",
            "version": "2",
            "title": "Refund policy",
            **STAFF_EU,
            "effective_from": day(-30),
        },
        "# Refund policy\n\nRefunds are paid within 5 days under rule RPL-14. "
        "Customers must keep the receipt or an order number.",
    ),
    (
        "future-v1.md",
        {
            "doc_id": "loyalty",
            "version": "1",
            "title": "Loyalty programme",
            **STAFF_EU,
            "effective_from": day(-100),
        },
        "Loyalty points are earned at one point per euro under rule LOY-0001.",
    ),
    (
        "future-v2.md",
        {
            "doc_id": "loyalty",
            "version": "2",
            "title": "Loyalty programme",
            **STAFF_EU,
            "effective_from": day(10),
        },
        "Loyalty points are earned at two points per euro under rule LOY-0002.",
    ),
    (
        "merchant.md",
        {
            "doc_id": "merchant-fraud",
            "title": "Merchant fraud thresholds",
            "tenant": "acme",
            "region": "EU",
            "acl": ["group:merchant-risk"],
            "effective_from": "2021-01-01",
        },
        "Merchants above the chargeback threshold MRX-7781 are suspended pending review.",
    ),
    (
        "starts-today.md",
        {"doc_id": "starts-today", "title": "Starts today", **STAFF_EU, "effective_from": day(0)},
        "The new shift roster BND-0101 applies from its first day.",
    ),
    (
        "ends-today.md",
        {
            "doc_id": "ends-today",
            "title": "Ends today",
            **STAFF_EU,
            "effective_from": "2022-01-01",
            "effective_to": day(0),
        },
        "The winter dress code BND-0202 applies until its last day.",
    ),
    (
        "ended.md",
        {
            "doc_id": "ended-yesterday",
            "title": "Ended",
            **STAFF_EU,
            "effective_from": "2022-01-01",
            "effective_to": day(-1),
        },
        "The old parking rule BND-0303 no longer applies.",
    ),
    (
        "us.md",
        {
            "doc_id": "us-holidays",
            "title": "US holidays",
            "tenant": "acme",
            "region": "US",
            "acl": ["group:staff"],
            "effective_from": "2020-01-01",
        },
        "Thanksgiving closing hours follow rule USR-5150 in every US store.",
    ),
    (
        "globex.md",
        {
            "doc_id": "globex-pricing",
            "title": "Globex pricing",
            "tenant": "globex",
            "region": "EU",
            "acl": ["group:staff"],
            "effective_from": "2020-01-01",
        },
        "Globex price matching follows rule GLX-9000 for all competitors.",
    ),
    (
        "remote.md",
        {
            "doc_id": "remote-work",
            "title": "Flexible arrangements",
            **STAFF_EU,
            "effective_from": "2020-01-01",
        },
        "Employees may perform their duties from their residence up to three days per week, "
        "provided their line manager approves the arrangement in writing.",
    ),
    (
        "quoted.md",
        {
            "doc_id": "quoted-team",
            "title": "Quoted team note",
            "tenant": "acme",
            "region": "EU",
            "acl": ['group:o\'brien "team"'],
            "effective_from": "2020-01-01",
        },
        "The quoted team keeps its inventory ledger under rule QTE-4242.",
    ),
    (
        "dup-a.md",
        {"doc_id": "dup-a", "title": "Shared text", **STAFF_EU, "effective_from": "2020-01-01"},
        "Gift cards never expire and can be used in any store, rule GFT-0001.",
    ),
    (
        "dup-b.md",
        {
            "doc_id": "dup-b",
            "title": "Shared text",
            "tenant": "acme",
            "region": "EU",
            "acl": ["group:merchant-risk"],
            "effective_from": "2020-01-01",
        },
        "Gift cards never expire and can be used in any store, rule GFT-0001.",
    ),
]


FILLER = [
    "Store opening hours are nine to six on weekdays and ten to four on Saturdays.",
    "Price tags must show the unit price for groceries sold by weight.",
    "Damaged goods are returned to the central warehouse every Friday.",
    "Cash registers are counted by two employees at the end of every shift.",
    "Customer complaints are logged in the service desk tool within one hour.",
    "Seasonal staff receive safety training before their first shift.",
    "Shelf labels are printed overnight from the pricing system.",
    "Fire exits must stay clear of pallets and boxes at all times.",
]
for i, text in enumerate(FILLER):
    CORPUS.append(
        (
            f"filler/f{i}.md",
            {
                "doc_id": f"filler-{i}",
                "title": f"Store note {i}",
                **STAFF_EU,
                "effective_from": "2020-01-01",
            },
            text,
        )
    )


def write_corpus(root: Path) -> Path:
    for name, meta, body in CORPUS:
        write_doc(root, name, meta, body)
    return root


def doc(doc_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "doc_id": doc_id,
        "version": "1",
        "title": f"Note {doc_id}",
        "text": f"The pelican quota for {doc_id} is PQ-{len(doc_id)} units per quarter.",
        "region": "EU",
        "acl": ["group:staff"],
        "effective_from": "2020-01-01",
        **fields,
    }


def seed(root: Path, embedder: Embedder) -> DataLayout:
    docs = root / "docs"
    meta = {"tenant": "acme", "region": "EU", "effective_from": "2020-01-01"}
    write_doc(docs, "s.md", {"doc_id": "secret", **meta, "acl": ["group:risk"]}, f"Rule {SECRET}.")
    write_doc(docs, "p.md", {"doc_id": "public", **STAFF_EU, "effective_from": "2020-01-01"}, "Hi.")
    layout = DataLayout(root / "data")
    ingest_paths([docs], layout, embedder)
    return layout


def big_batch(path: Path, count: int, short: bool = False) -> Path:
    """`count` documents of real text, the slice's paragraphs taken again as needed. `short`
    keeps each paragraph's first sentence: as many documents and chunks to write, a
    fraction of the embedding, for tests that interrupt the writing, not the embedding."""
    paragraphs = [json.loads(line) for line in SQUAD_SLICE.read_text().splitlines()]
    with path.open("w") as out:
        for n, p in zip(range(count), itertools.cycle(paragraphs), strict=False):
            text = p["text"].split(". ")[0] + "." if short else p["text"]
            record = {"doc_id": f"bulk-{n}", "title": p["title"], "text": text, **STAFF_EU}
            out.write(json.dumps({**record, "effective_from": "2020-01-01"}) + "\n")
    return path


def minimal_pdf(
    path: Path, lines: list[str], title: str = "Store manual", encoding: str = "WinAnsiEncoding"
) -> Path:
    """A real one-page PDF with a text stream and a title, written byte by byte; its font's
    `/Encoding` is the name given."""
    text = "BT /F1 12 Tf 72 720 Td " + " ".join(f"({line}) Tj 0 -16 Td" for line in lines) + " ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
        " /Resources << /Font << /F1 5 0 R >> >> >>",
        f"<< /Length {len(text)} >>\nstream\n{text}\nendstream",
        f"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /{encoding} >>",
        f"<< /Title ({title}) >>",
    ]
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    trailer = f"<< /Size {len(objects) + 1} /Root 1 0 R /Info 6 0 R >>"
    out += f"trailer\n{trailer}\nstartxref\n{xref}\n%%EOF\n".encode()
    path.write_bytes(out)
    return path


def tree_digest(root: Path) -> str:
    """What the writer has written of the index; the readers' vector copies (`flat/`) and
    the catalog are left out. The catalog is a database: its file's bytes change when
    SQLite moves its write-ahead log into it, which happens as the last connection closes,
    whenever the garbage collector closes it (a CI run failed on that, with no new write);
    and a job's writer records its progress there while it embeds. Tests check what the
    catalog holds by asking it."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix not in {".lock"}):
        if (
            path.name.startswith((".ingest", "catalog.db"))
            or path.relative_to(root).parts[0] == "flat"
        ):
            continue
        digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()


def ingest_ann_notes(root: Path, embedder: Embedder) -> DataLayout:
    """300 short notes of acme/EU (2 only for group:few), with an IVF-PQ index on the table."""
    topics = ["refund", "shipping", "warranty", "loyalty", "returns", "invoices"]
    docs = root / "docs"
    docs.mkdir()
    lines = []
    for n in range(300):
        acl = ["group:staff"] if n >= 2 else ["group:few"]
        record = {
            "doc_id": f"d{n}",
            "title": f"Note {n}",
            "text": f"Note {n} on {topics[n % len(topics)]} number {n}.",
            **{k: v for k, v in STAFF_EU.items() if k != "acl"},
            "acl": acl,
            "effective_from": "2020-01-01",
        }
        lines.append(json.dumps(record))
    (docs / "notes.jsonl").write_text("\n".join(lines) + "\n")
    layout = DataLayout(root / "data")
    ingest_paths([docs], layout, embedder, ann_min_rows=256)  # the table gets IVF-PQ
    return layout


STAFF = Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY)


RISK = Restriction("acme", frozenset({"group:risk"}), frozenset({"EU"}), TODAY)
