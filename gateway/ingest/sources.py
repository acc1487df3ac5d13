"""Files to validated Documents: which files are documents, where their metadata comes from.

Formats: Markdown and text (`.md .markdown .txt`, metadata in YAML front matter), JSONL
(one document per line, body in `text`), HTML (`.html .htm`) and PDF (`.pdf`), whose text
is extracted. Metadata, later sources winning field by field:

1. defaults from the command line (`gateway ingest --tenant ... --acl ...`);
2. a sidecar file beside the document, `<file name>.meta.yaml` (or `.meta.yml`,
   `.meta.json`), e.g. `handbook.pdf.meta.yaml`;
3. the document's own front matter, or its JSONL record.

Files with no front matter take `doc_id` from their file name and `title` from the page
(HTML `<title>`, PDF metadata, first heading). Deny by default still holds: whatever the
sources, a document without tenant, region, ACL or start date is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.domain import Document
from gateway.ingest.formats import Extracted, extract_html, extract_pdf
from gateway.ingest.parse import (
    DocumentProblem,
    DocumentsRefused,
    front_matter,
    parse_jsonl_line,
    parse_record,
    read_metadata_file,
    refuse,
)

TEXT = frozenset({".md", ".markdown", ".txt"})
EXTRACTED = frozenset({".html", ".htm", ".pdf"})
SUFFIXES = TEXT | EXTRACTED | {".jsonl"}
SIDECARS = (".meta.yaml", ".meta.yml", ".meta.json")
_KINDS = "expected .md, .markdown, .txt, .jsonl, .html, .htm or .pdf"


def sidecar_of(path: Path) -> Path | None:
    return next((c for s in SIDECARS if (c := path.with_name(path.name + s)).is_file()), None)


def _is_sidecar(path: Path) -> bool:
    return path.name.endswith(SIDECARS)


def _files(paths: Sequence[Path], problems: list[DocumentProblem]) -> list[Path]:
    unique: dict[Path, Path] = {}  # by resolved path: a file named twice is read once
    for path in paths:
        # Inside directories other files are simply not documents; named ones are mistakes.
        if not path.is_dir() and (path.suffix.lower() not in SUFFIXES or _is_sidecar(path)):
            why = f"unsupported type; {_KINDS}" if path.exists() else "no such file or directory"
            problems.append(DocumentProblem(str(path), "file", why))
            continue
        found = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in (f for f in found if f.suffix.lower() in SUFFIXES and not _is_sidecar(f)):
            unique.setdefault(file.resolve(), file)
    return list(unique.values())


def _extracted(path: Path) -> Extracted:
    if path.suffix.lower() == ".pdf":
        return extract_pdf(path)
    return extract_html(path.read_bytes())


def _documents_of(path: Path, defaults: Mapping[str, Any]) -> list[Document]:
    source = str(path)
    suffix = path.suffix.lower()
    sidecar = sidecar_of(path)
    base = {**defaults, **(read_metadata_file(sidecar) if sidecar else {})}
    if suffix == ".jsonl":
        documents, problems = [], []
        for n, line in enumerate(path.read_text(encoding="utf-8-sig").split("\n"), 1):
            try:
                if line.strip():
                    documents.append(parse_jsonl_line(f"{path}:{n}", line, base))
            except DocumentsRefused as refused:  # every bad line is reported, not the first
                problems += refused.problems
        if problems:
            raise DocumentsRefused(problems)
        return documents
    if suffix in EXTRACTED:
        try:
            extracted = _extracted(path)
        except Exception as exc:  # a broken file is refused by name, never a crash
            raise refuse(source, "file", f"cannot extract text ({type(exc).__name__})") from None
        named = {"doc_id": path.stem, "title": extracted.title}
        return [parse_record({**named, **base}, extracted.text, source, default_uri=source)]
    meta, body = front_matter(source, path.read_text(encoding="utf-8-sig"))
    if meta is None and not base:
        raise refuse(source, "front_matter", "missing: expected '---', YAML fields, '---', body")
    record = {"doc_id": path.stem, **base} if meta is None else {**base, **meta}
    return [parse_record(record, body, source, default_uri=source)]


def load_documents(
    paths: Sequence[Path], defaults: Mapping[str, Any] | None = None
) -> list[Document]:
    """All documents from files and directories (recursively, sorted), or raise
    DocumentsRefused listing every problem found, not just the first."""
    problems: list[DocumentProblem] = []
    documents: list[Document] = []
    for path in _files(paths, problems):
        try:
            documents += _documents_of(path, defaults or {})
        except (OSError, UnicodeDecodeError) as exc:
            message = getattr(exc, "strerror", None) or str(exc)  # names a byte, never text
            problems.append(DocumentProblem(str(path), "file", message))
        except DocumentsRefused as refused:
            problems += refused.problems
    first_source: dict[str, str] = {}
    for doc in documents:
        first = first_source.setdefault(doc.key, doc.source)
        if first != doc.source:
            problems.append(
                DocumentProblem(doc.source, "doc_id", f"{doc.label} is also in {first}")
            )
    if problems:
        raise DocumentsRefused(problems)
    return documents
