"""Docs whose code references cannot rot, and code whose pointers into the docs cannot.

What the pages (the top-level README.md and docs/*.md) may name, and what is checked:

- a repository path, in backticks, in a Markdown link or in a code block: it exists.
  A path starts at the repository root (`gateway/ingest/writer.py`, `scripts/`, `deploy/`)
  or, in backticks, is a Python file named by its last parts (`lanes/dense.py`,
  `worker.py`), which some file of the repository must end with. A link's `#anchor` is a
  heading of the page it points at.
- a test: `tests/test_x.py::test_name` names a test in that file; a following
  `::test_other` means the same file.
- a definition in a file, written `` `path`: `name`, `Class.method` `` (as in the tables
  of architecture.md), `` `name` in `path` `` or `` `name` (`path`) ``: the file defines
  it at top level or in that class (`ast`, nothing imported).
- a dotted name: `gateway.x.y` is a module or package of this repository, and any further
  parts are definitions in it (unless the code spells it as a string: a span attribute
  such as `gateway.policy_version`); `Class.member` with a class of this package names a
  member of it (or of a base class), set in its body or as `self.member` by a method.

Left alone: paths of a data dir or an example (`lexical/g000001/`, `docs/refund-v2.md` in
a sample response), placeholders in capitals (`scripts/NAME.py`), and prose.
- the layout of the README ("Layout"): every path in its first column exists, every file
  a row names exists in that row's folder, and every package and module of `gateway/` and
  every script of `scripts/` has its row or is named in one.

A comment in the code (comments, docstrings and `description=` texts in gateway/,
scripts/, tests/, and the YAML comments of gateway/ and policies/) names only repository
paths that exist, and one that points into the docs follows one convention: the page's
path, a comma and the heading as the page spells it, in double quotes, e.g.
(docs/evaluation.md, "Ranking documents"). Backticks in a heading may be left out and it
may wrap onto the next comment line; `docs/evaluation.md#ranking-documents`, the anchor
of a Markdown link, is accepted too. A page with nothing after it is refused: a pointer
names where on the page to read, so that a figure which moves away breaks this test
instead of sending the reader to a page that no longer holds it.

Every failure names the file, the line and the reference.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages a comment may point at.
POINTABLE = [*PAGES, ROOT / "CHANGELOG.md", ROOT / "deploy" / "README.md"]
ROOTED = ("gateway/", "scripts/", "tests/", "deploy/", "docs/", "policies/")
TOP_FILES = ("README.md", "CHANGELOG.md", "Makefile", "pyproject.toml", "openapi.yaml")
CODE_DIRS = ("gateway", "scripts", "tests")

BACKTICKED = re.compile(r"`([^`\n]+)`")
MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH_TOKEN = re.compile(r"^(?:[\w.-]+(?:/[\w.-]+)*/?)?(?:::\w+)?$")
IDENTIFIER = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?"
# `path`: `name`, `Class.method`  (also `/`, `and` between names)
NAME = rf"`{IDENTIFIER}(?:\(\))?`"
PATH_THEN_NAMES = re.compile(
    rf"`([\w./-]+\.py)`\]?(?:\([^)]*\))?: ({NAME}(?:(?:, | / |,? and ){NAME})*)"
)
# `name` in `path`, `name` in [`path`](...), `name` (`path`), `name` ([`path`](...))
NAME_THEN_PATH = re.compile(rf"`({IDENTIFIER})(?:\(\))?`(?: in | \(\[?)`([\w./-]+\.py)`")
ROOTED_IN_TEXT = re.compile(
    r"(?<![\w./<-])((?:gateway|scripts|tests|deploy|docs|policies)/[\w./-]*\w/?)"
)
# In code blocks `docs/` is the folder of the example documents, not this one.
ROOTED_IN_CODE = re.compile(
    r"(?<![\w./<\"-])((?:gateway|scripts|tests|deploy|policies)/[\w./-]*\w/?)"
)
PLACEHOLDER = re.compile(r"(?:^|/)(?!README|CHANGELOG)[A-Z]+(?:\.\w+)?(?:/|$)")  # scripts/NAME.py
CAMEL_DOTTED = re.compile(r"^([A-Z][a-z0-9]\w*)\.([A-Za-z_]\w*)(?:\(\))?$")
PACKAGE_DOTTED = re.compile(r"^gateway(?:\.[A-Za-z_]\w*)+$")


@dataclass
class Problems:
    found: list[str] = field(default_factory=list)

    def add(self, where: Path, line: int, message: str) -> None:
        self.found.append(f"{where.relative_to(ROOT)}:{line}: {message}")


# -- what the repository holds --------------------------------------------------------------


@cache
def python_files() -> tuple[Path, ...]:
    return tuple(
        p
        for d in CODE_DIRS
        for p in sorted((ROOT / d).rglob("*.py"))
        if "__pycache__" not in p.parts
    )


def files_ending_with(tail: str) -> list[Path]:
    return [p for p in python_files() if p.as_posix().endswith("/" + tail)]


@dataclass
class ClassInfo:
    members: set[str]
    bases: list[str]


@dataclass
class ModuleInfo:
    names: set[str]
    classes: dict[str, ClassInfo]


def _assigned(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _assigned(element)


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A body's statements, with those under `if` and `try` (TYPE_CHECKING, fallbacks)."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _statements(node.body)
            yield from _statements(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _statements(part)
        else:
            yield node


def _defined(node: ast.stmt) -> Iterator[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        yield node.name
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            yield from _assigned(target)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        yield from _assigned(node.target)


def _class_info(node: ast.ClassDef) -> ClassInfo:
    members: set[str] = set()
    for statement in _statements(node.body):
        members.update(_defined(statement))
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(statement):  # attributes the methods set: self.x = ...
                targets = (
                    inner.targets
                    if isinstance(inner, ast.Assign)
                    else [inner.target]
                    if isinstance(inner, ast.AnnAssign)
                    else []
                )
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    ):
                        members.add(target.attr)
    bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
    return ClassInfo(members, [b.rsplit(".", 1)[-1].split("[", 1)[0] for b in bases])


@cache
def module_info(path: Path) -> ModuleInfo:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    classes: dict[str, ClassInfo] = {}
    for node in _statements(tree.body):
        names.update(_defined(node))
        if isinstance(node, ast.ClassDef):
            classes[node.name] = _class_info(node)
    return ModuleInfo(names, classes)


@cache
def classes_of_the_package() -> dict[str, list[ClassInfo]]:
    found: dict[str, list[ClassInfo]] = {}
    for path in python_files():
        if path.is_relative_to(ROOT / "gateway"):
            for name, info in module_info(path).classes.items():
                found.setdefault(name, []).append(info)
    return found


def class_has(info: ClassInfo, member: str, seen: frozenset[str] = frozenset()) -> bool:
    if member in info.members:
        return True
    for base in info.bases:
        if base not in seen:
            for parent in classes_of_the_package().get(base, []):
                if class_has(parent, member, seen | {base}):
                    return True
    return False


def defines(path: Path, name: str) -> bool:
    """`name` or `Class.member` is defined at the top level of `path` or in that class."""
    info = module_info(path)
    head, _, member = name.removesuffix("()").partition(".")
    if not member:
        return head in info.names
    cls = info.classes.get(head)
    return cls is not None and class_has(cls, member)


def has_test(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return True
    return False


@cache
def strings_of_the_package() -> frozenset[str]:
    """Every string constant in gateway/: a dotted one is a name the code uses (a span
    attribute such as `gateway.policy_version`), not a module path."""
    found: set[str] = set()
    for path in python_files():
        if path.is_relative_to(ROOT / "gateway"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found.add(node.value)
    return frozenset(found)


def module_path(dotted: str) -> Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    if (base / "__init__.py").exists():
        return base / "__init__.py"
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py")
    return None


def resolves(dotted: str) -> bool:
    """gateway.x.y[.Name[.member]]: the longest module prefix, then definitions by ast."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = module_path(".".join(parts[:cut]))
        if module is not None:
            rest = parts[cut:]
            return not rest or (len(rest) <= 2 and defines(module, ".".join(rest)))
    return False


# -- headings -----------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def lines_outside_code_blocks(text: str) -> Iterator[tuple[int, str, bool]]:
    """(line number, line, inside a fenced block)."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        yield number, line, fenced


@cache
def headings(page: Path) -> tuple[frozenset[str], frozenset[str]]:
    """A page's headings as written (backticks dropped) and as anchors."""
    titles: set[str] = set()
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for _, line, fenced in lines_outside_code_blocks(page.read_text()):
        match = re.match(r"#{1,6} (.+?)\s*#*$", line)
        if match and not fenced:
            title = match.group(1).strip()
            titles.add(title.replace("`", ""))
            anchor = slug(title)
            repeats = seen.get(anchor, 0)
            seen[anchor] = repeats + 1
            anchors.add(f"{anchor}-{repeats}" if repeats else anchor)  # as GitHub numbers them
    return frozenset(titles), frozenset(anchors)


# -- the pages ----------------------------------------------------------------------------


def check_path(
    token: str, page: Path, number: int, last_test: list[Path], problems: Problems
) -> None:
    path, _, test = token.partition("::")
    if not path:  # `::test_other`: the test file named last
        if not last_test:
            problems.add(page, number, f"`{token}` follows no test file")
        elif not has_test(last_test[0], test):
            problems.add(
                page, number, f"`{token}`: no such test in {last_test[0].relative_to(ROOT)}"
            )
        return
    if path.startswith(ROOTED) or path in TOP_FILES:
        target = ROOT / path
        if not target.exists():
            problems.add(page, number, f"`{token}`: no such path")
            return
    elif path.endswith(".py"):
        candidates = files_ending_with(path)
        if not candidates:
            problems.add(page, number, f"`{token}`: no file of the repository ends with {path}")
            return
        target = candidates[0]
    else:
        return  # a data dir's path, a file in an example
    if test:
        if target.suffix != ".py" or not has_test(target, test):
            problems.add(page, number, f"`{token}`: no such test")
        last_test[:] = [target]
    elif target.name.startswith("test_") and target.suffix == ".py":
        last_test[:] = [target]


def check_names_in_file(
    path_text: str, names: list[str], page: Path, number: int, problems: Problems
) -> None:
    if path_text.startswith(ROOTED):
        candidates = [ROOT / path_text] if (ROOT / path_text).exists() else []
    else:
        candidates = files_ending_with(path_text)
    if not candidates:
        problems.add(page, number, f"`{path_text}`: no such file")
        return
    for name in names:
        if not any(defines(c, name) for c in candidates):
            problems.add(page, number, f"`{path_text}`: `{name}` is not defined there")


def check_page(page: Path, problems: Problems) -> None:
    text = page.read_text()
    last_test: list[Path] = []
    for number, line, fenced in lines_outside_code_blocks(text):
        prose = line if fenced else BACKTICKED.sub("", line)  # backticked paths come below
        for rooted in (ROOTED_IN_CODE if fenced else ROOTED_IN_TEXT).findall(prose):
            if not PLACEHOLDER.search(rooted) and not (ROOT / rooted).exists():
                problems.add(page, number, f"{rooted}: no such path")
        if fenced:
            continue
        for token in BACKTICKED.findall(line):
            token = token.strip()
            if PLACEHOLDER.search(token):
                continue
            if PATH_TOKEN.match(token) and (
                "/" in token or token.endswith(".py") or token.startswith("::")
            ):
                check_path(token, page, number, last_test, problems)
            elif PACKAGE_DOTTED.match(token) and token not in strings_of_the_package():
                if not resolves(token):
                    problems.add(
                        page, number, f"`{token}`: not a module or definition of this package"
                    )
            elif match := CAMEL_DOTTED.match(token):
                cls, member = match.groups()
                known = classes_of_the_package().get(cls)
                if known is not None and not any(class_has(c, member) for c in known):
                    problems.add(page, number, f"`{token}`: class {cls} has no member {member}")
        for path_text, names in PATH_THEN_NAMES.findall(line):
            check_names_in_file(path_text, BACKTICKED.findall(names), page, number, problems)
        for name, path_text in NAME_THEN_PATH.findall(line):
            check_names_in_file(path_text, [name], page, number, problems)
        for target in MARKDOWN_LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue
            path_part, _, anchor = target.partition("#")
            linked = (page.parent / path_part).resolve() if path_part else page
            if not linked.is_relative_to(ROOT) or not linked.exists():
                problems.add(page, number, f"link {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in headings(linked)[1]:
                problems.add(page, number, f"link {target}: no such heading")


def test_every_code_reference_of_the_docs_names_something_that_exists() -> None:
    problems = Problems()
    for page in PAGES:
        check_page(page, problems)
    assert problems.found == [], "\n".join(problems.found)


def layout_rows() -> list[tuple[int, str, str]]:
    """(line, path, what the row says) of the block in README.md, "Layout", continuations
    joined."""
    lines = (ROOT / "README.md").read_text().splitlines()
    heading = lines.index("## Layout")
    opening = next(i for i in range(heading, len(lines)) if lines[i].startswith("```"))
    rows: list[tuple[int, str, str]] = []
    for i in range(opening + 1, len(lines)):
        line = lines[i]
        if line.startswith("```"):
            break
        if line and not line[0].isspace():
            path, _, said = line.partition(" ")
            rows.append((i + 1, path, said))
        elif line.strip() and rows:
            rows[-1] = (rows[-1][0], rows[-1][1], rows[-1][2] + " " + line.strip())
    return rows


def test_the_readmes_layout_names_what_exists_and_leaves_nothing_out() -> None:
    readme = ROOT / "README.md"
    problems = Problems()
    rows = layout_rows()
    assert rows, "the README's layout block was not found"
    listed: set[Path] = set()
    for number, path, said in rows:
        where = ROOT / path
        if not where.exists():
            problems.add(readme, number, f"layout row {path}: no such path")
            continue
        listed.add(where.resolve())
        for name in re.findall(r"[\w-]+\.(?:py|html|js|css|yaml|json)\b", said):
            found = list(where.rglob(name)) if where.is_dir() else []
            if not found:
                problems.add(readme, number, f"layout row {path}: {name} is not in it")
            listed.update(p.resolve() for p in found)
    wanted = [
        *(p for p in (ROOT / "gateway").iterdir() if p.is_dir() and p.name != "__pycache__"),
        *(
            p
            for p in (ROOT / "gateway").glob("*.py")
            if p.name not in {"__init__.py", "__main__.py"}
        ),
        *(ROOT / "scripts").glob("*.py"),
    ]
    for module in sorted(wanted):
        if module.resolve() not in listed:
            problems.add(readme, rows[0][0], f"the layout leaves out {module.relative_to(ROOT)}")
    assert problems.found == [], "\n".join(problems.found)


# -- the code's pointers into the docs --------------------------------------------------------

DOC_POINTER = re.compile(
    r"(?<![\w/.-])(?P<page>README(?:\.md)?|(?:docs/|deploy/)?[\w-]+\.md)"
    r"(?:(?P<anchor>#[\w-]+)|,?\s+\"(?P<heading>[^\"]+)\")?"
)


def commentary_of_python(path: Path) -> Iterator[tuple[int, str]]:
    """Comments (a run of comment lines as one text), docstrings and `description=` texts,
    each with the line it starts on."""
    source = path.read_text()
    run: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            if run and token.start[0] != run[-1][0] + 1:
                yield run[0][0], "\n".join(text for _, text in run)
                run = []
            run.append((token.start[0], token.string.lstrip("#")))
    if run:
        yield run[0][0], "\n".join(text for _, text in run)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                yield first.lineno, first.value.value
        elif isinstance(node, ast.keyword) and node.arg == "description":
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                yield value.lineno, value.value


def commentary_of_yaml(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = re.search(r"(?:^|\s)#(.*)$", line)
        if match:
            yield number, match.group(1)


def commentary() -> Iterator[tuple[Path, int, str]]:
    for path in python_files():
        if path == Path(__file__).resolve():
            continue  # this module names the pages themselves, not places in them
        for number, text in commentary_of_python(path):
            yield path, number, text
    for folder in ("gateway", "policies"):
        for path in sorted((ROOT / folder).rglob("*.yaml")):
            for number, text in commentary_of_yaml(path):
                yield path, number, text


def pointed_page(name: str) -> Path | None:
    name = "README.md" if name == "README" else name
    for candidate in (ROOT / name, ROOT / "docs" / name):
        if candidate in POINTABLE:
            return candidate
    return None


def test_every_pointer_of_the_code_into_the_docs_names_a_page_and_a_heading_that_exist() -> None:
    problems = Problems()
    for path, first_line, text in commentary():
        for rooted in ROOTED_IN_TEXT.finditer(text):  # a path of the repository, too
            if not PLACEHOLDER.search(rooted.group(1)) and not (ROOT / rooted.group(1)).exists():
                number = first_line + text.count("\n", 0, rooted.start())
                problems.add(path, number, f"{rooted.group(1)}: no such path")
        for match in DOC_POINTER.finditer(text):
            number = first_line + text.count("\n", 0, match.start())
            ref = " ".join(match.group(0).split())
            page = pointed_page(match.group("page"))
            if page is None:
                problems.add(path, number, f"{ref}: no such page of the docs")
                continue
            titles, anchors = headings(page)
            if match.group("anchor"):
                if match.group("anchor")[1:] not in anchors:
                    problems.add(path, number, f"{ref}: no such heading")
            elif match.group("heading"):
                heading = " ".join(match.group("heading").replace("`", "").split())
                if heading not in titles:
                    problems.add(path, number, f"{ref}: no such heading")
            else:
                where = page.relative_to(ROOT)
                problems.add(path, number, f'{ref}: name the heading too: {where}, "Heading"')
    assert problems.found == [], "\n".join(problems.found)
