"""Files to validated Documents: which files are documents, where their metadata comes from.

Formats: Markdown and text (`.md .markdown .txt`, metadata in YAML front matter), JSONL
(one document per line, body in `text`), HTML (`.html .htm`) and PDF (`.pdf`), whose text
is extracted. Metadata, later sources winning field by field:

1. defaults from the command line (`gateway ingest --tenant ... --acl ...`);
2. a sidecar file beside the document, `<file name>.meta.yaml` (or `.meta.yml`,
   `.meta.json`, in any case, as document suffixes are), e.g. `handbook.pdf.meta.yaml`;
   a document with more than one is refused, naming them;
3. the document's own front matter, or its JSONL record.

Files with no front matter take `doc_id` from their file name and `title` from the page
(HTML `<title>`, PDF metadata, first heading). Deny by default still holds: whatever the
sources, a document without tenant, region, ACL or start date is refused.

A folder's files are read only inside it: a document linked (or in a directory linked) to
a place outside the folder is skipped and named in `skipped`, never opened, and a sidecar
linked outside refuses its document. Each file is opened by its resolved path (a
document by its own name, a link in its place refused) with `O_NOFOLLOW`, and the file
opened is checked again, so a link swapped in meanwhile is refused rather than followed
(a shared folder's writers may not choose what the connector's own account reads, such
as its key file).

A document is read under its own name only, so that it takes its own sidecar and doc_id,
never those of a link to it: a link in a folder to a file in the folder is passed over
(named in `linked`), as the walk reaches that file itself, and a file named on its own
that is a link is read as the file it leads to.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.domain import Document
from gateway.ingest.formats import Extracted, TextTooLong, extract_html, extract_pdf
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


OUTSIDE = "a link to a place outside the folder; not read"


def sidecars_of(path: Path, listings: dict[Path, list[str]]) -> list[Path]:
    """The sidecars beside `path`: its name and a sidecar suffix in any case, as document
    suffixes are read (`HANDBOOK.PDF.META.YAML` is never passed over for the defaults).
    Any entry counts, a dangling link too: one that cannot be read refuses its document.
    `listings` keeps each directory's names, listed once for all its documents."""
    directory = path.parent
    names = listings.get(directory)
    if names is None:
        try:
            names = listings[directory] = sorted(os.listdir(directory))
        except OSError:  # a directory that may be entered, not listed: the usual names only
            names = [n for s in SIDECARS if os.path.lexists(directory / (n := path.name + s))]
    size = len(path.name)
    return [directory / n for n in names if n[:size] == path.name and n[size:].lower() in SIDECARS]


def _is_sidecar(path: Path) -> bool:
    return path.name.lower().endswith(SIDECARS)


def _is_document(path: Path) -> bool:
    return path.suffix.lower() in SUFFIXES and not _is_sidecar(path)


def _resolved(path: Path) -> Path:
    """`path.resolve()`, a link loop an OSError (ELOOP) like any other unreadable path,
    where Python 3.11 raises RuntimeError."""
    try:
        return path.resolve()
    except RuntimeError:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path)) from None


def _unread(exc: OSError) -> str:
    return f"cannot be read ({exc.strerror or type(exc).__name__})"


def _inside(path: Path, root: Path) -> bool:
    return _resolved(path).is_relative_to(root)


def _walk(folder: Path, skipped: list[Path], problems: list[DocumentProblem]) -> list[Path]:
    """The folder's files, links out of it left out (documents and directories named in
    `skipped`); linked directories are never descended, their files are reached directly.
    A directory that cannot be listed is a problem: its files are not known to be gone,
    and a sync that took them for gone would delete them."""
    root, found = folder.resolve(), []

    def unlisted(exc: OSError) -> None:
        where = exc.filename if exc.filename is not None else folder
        why = f"cannot be listed ({exc.strerror or type(exc).__name__})"
        problems.append(DocumentProblem(str(where), "folder", why))

    def links_out(path: Path, field: str | None) -> bool:
        """Whether `path` is a link out of the folder. A link that leads nowhere, round a
        loop, is not read either, and is a problem naming it (`field` None: not one)."""
        if not path.is_symlink():
            return False
        try:
            return not _inside(path, root)
        except OSError as exc:
            problems.extend([DocumentProblem(str(path), field, _unread(exc))] if field else [])
            return False

    for here, directories, names in os.walk(folder, onerror=unlisted):  # followlinks=False
        for name in sorted(directories):
            if links_out(path := Path(here, name), "folder"):
                skipped.append(path)
        for name in sorted(names):
            path, document = Path(here, name), _is_document(Path(name))
            if links_out(path, "file" if document else None):
                skipped += [path] if document else []
            elif path.is_file():
                found.append(path)
    return sorted(found)


def _files(
    paths: Sequence[Path],
    problems: list[DocumentProblem],
    skipped: list[Path],
    linked: list[Path],
) -> list[tuple[Path, Path | None]]:
    """(file, the folder it must stay in): None for a file named on its own; its sidecar
    still must stay beside it. Each file under its own name, never a link's (see above)."""
    unique: dict[Path, tuple[Path, Path | None]] = {}  # by resolved path: read once
    for path in paths:
        # Inside directories other files are simply not documents; named ones are mistakes.
        if not path.is_dir() and not _is_document(path):
            why = f"unsupported type; {_KINDS}" if path.exists() else "no such file or directory"
            problems.append(DocumentProblem(str(path), "file", why))
            continue
        root = path.resolve() if path.is_dir() else None
        found = _walk(path, skipped, problems) if path.is_dir() else [path]
        for file in filter(_is_document, found):
            try:
                real = _resolved(file)
            except OSError as exc:  # a link loop
                problems.append(DocumentProblem(str(file), "file", _unread(exc)))
                continue
            if file.is_symlink() and root is not None:  # the walk reaches `real` itself
                linked.append(file)
            elif file.is_symlink() and not _is_document(real):
                why = f"a link to {real.name}: unsupported type; {_KINDS}"
                problems.append(DocumentProblem(str(file), "file", why))
            else:
                unique.setdefault(real, (real if file.is_symlink() else file, root))
    return list(unique.values())


def read_inside(path: Path, root: Path | None, *, own: bool = False) -> bytes:
    """The bytes of a regular file that lies inside `root` (when given), by a path without
    links opened with O_NOFOLLOW; OSError (a PermissionError naming OUTSIDE) otherwise.
    O_NONBLOCK: a FIFO is refused as not a regular file, never waited on. `own`: `path`
    itself, a link in its place refused (ELOOP): a document swapped for a link since the
    walk would pair the linked file's text with this name's sidecar."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    target = path
    if root is not None:
        target = _resolved(path.parent) / path.name if own else _resolved(path)
        flags |= os.O_NOFOLLOW
        if not target.is_relative_to(root):
            raise PermissionError(0, OUTSIDE)
    descriptor = os.open(target, flags)
    try:
        opened = Path(f"/proc/self/fd/{descriptor}")  # where the file opened really lies
        if root and opened.exists() and not Path(os.readlink(opened)).is_relative_to(root):
            raise PermissionError(0, OUTSIDE)
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(0, "not a regular file")
        with os.fdopen(descriptor, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(descriptor)


def _text(raw: bytes) -> str:
    """UTF-8 text (a byte order mark dropped), newlines as `Path.read_text` gives them."""
    return raw.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")


def _unread_text(exc: OSError | UnicodeDecodeError) -> str:
    """Why a file could not be read, naming a byte and its offset, never text."""
    if isinstance(exc, UnicodeDecodeError):  # Python's own words do not say what to do
        return (
            f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): "
            "save it as UTF-8"
        )
    return getattr(exc, "strerror", None) or str(exc)


def _metadata(sidecar: Path | None, root: Path) -> dict[str, Any]:
    if sidecar is None:
        return {}
    try:
        content = _text(read_inside(sidecar, root))
    except (OSError, UnicodeDecodeError) as exc:  # the sidecar is named, the document refused
        raise refuse(str(sidecar), "file", _unread_text(exc)) from None
    return read_metadata_file(sidecar, content)


def _extracted(path: Path, raw: bytes) -> Extracted:
    if path.suffix.lower() == ".pdf":
        return extract_pdf(raw)
    return extract_html(raw)


def _documents_of(
    path: Path, root: Path | None, defaults: Mapping[str, Any], listings: dict[Path, list[str]]
) -> list[Document]:
    source = str(path)
    suffix = path.suffix.lower()
    sidecars = sidecars_of(path, listings)
    if len(sidecars) > 1:  # which one was meant is not ours to guess: one may be narrower
        names = ", ".join(s.name for s in sidecars)
        raise refuse(source, "file", f"more than one sidecar ({names}); keep one")
    sidecar = sidecars[0] if sidecars else None
    base = {**defaults, **_metadata(sidecar, root or _resolved(path.parent))}
    raw = read_inside(path, root, own=True)
    if suffix == ".jsonl":
        documents, problems = [], []
        for n, line in enumerate(_text(raw).split("\n"), 1):
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
            extracted = _extracted(path, raw)
        except TextTooLong as exc:  # its message names the limit, never the content
            raise refuse(source, "file", str(exc)) from None
        except Exception as exc:  # a broken file is refused by name, never a crash
            raise refuse(source, "file", f"cannot extract text ({type(exc).__name__})") from None
        named = {"doc_id": path.stem, "title": extracted.title}
        return [parse_record({**named, **base}, extracted.text, source, default_uri=source)]
    meta, body = front_matter(source, _text(raw))
    if meta is None and not base:
        raise refuse(source, "front_matter", "missing: expected '---', YAML fields, '---', body")
    record = {"doc_id": path.stem, **base} if meta is None else {**base, **meta}
    return [parse_record(record, body, source, default_uri=source)]


def load_documents(
    paths: Sequence[Path],
    defaults: Mapping[str, Any] | None = None,
    *,
    skipped: list[Path] | None = None,
    linked: list[Path] | None = None,
) -> list[Document]:
    """All documents from files and directories (recursively, sorted), or raise
    DocumentsRefused listing every problem found, not just the first. Links out of a
    directory are added to `skipped`, links in it to files in it to `linked` (lists the
    caller reports); neither is read."""
    problems: list[DocumentProblem] = []
    documents: list[Document] = []
    listings: dict[Path, list[str]] = {}
    links = linked if linked is not None else []
    for path, root in _files(paths, problems, skipped if skipped is not None else [], links):
        try:
            documents += _documents_of(path, root, defaults or {}, listings)
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(DocumentProblem(str(path), "file", _unread_text(exc)))
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
