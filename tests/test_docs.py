"""Docs that cannot drift: the settings table, the API reference, links, the package layering.

The demo's figures in README.md, "The demo" are checked against the demo itself in
test_demo.py.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import SecretStr

from gateway.errors import ERROR_CODES, ErrorCode
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "deploy" / "README.md",
    *DOCS.glob("*.md"),
]
TABLE_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]+)` \| ([^|]+) \|", re.M)
MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def environment_name(name: str, field: Any) -> str:
    alias = field.validation_alias
    return alias if isinstance(alias, str) else f"GATEWAY_{name.upper()}"


def as_environment_would_spell(value: object) -> str:
    """A default as a user would set it: `true`, `30`, `data`; "unset" when empty or None."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if value is None or value == "":
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def settings_table() -> dict[str, str]:
    text = (DOCS / "operations.md").read_text()
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = TABLE_ROW.findall(section)
    names = [name for name, _ in rows]
    assert len(names) == len(set(names)), "a variable is listed twice"
    return {name: default.strip() for name, default in rows}


def test_settings_table_lists_every_setting_with_its_default() -> None:
    expected = {
        environment_name(name, field): as_environment_would_spell(field.default)
        for name, field in Settings.model_fields.items()
    }
    assert settings_table() == expected


def test_every_route_of_the_openapi_document_is_in_the_api_reference() -> None:
    spec = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    routes = {f"{method.upper()} {path}" for path, ops in spec["paths"].items() for method in ops}
    headings = set(re.findall(r"^### `([A-Z]+ /[^`]*)`$", (DOCS / "api.md").read_text(), re.M))
    assert routes <= headings, f"routes missing from docs/api.md: {sorted(routes - headings)}"
    assert headings <= routes, f"docs/api.md names routes that do not exist: {headings - routes}"


def test_every_error_code_is_in_the_api_reference() -> None:
    text = (DOCS / "api.md").read_text()
    assert [code for code in ERROR_CODES if f"`{code}`" not in text] == []


def test_no_link_leaves_the_repository() -> None:
    """A clone is all a newcomer has: relative links resolve inside it, to files that exist."""
    broken = []
    for page in PAGES:
        for target in MARKDOWN_LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor on the same page
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_no_page_points_at_the_teams_shared_folder() -> None:
    for page in [*PAGES, ROOT / "Makefile"]:
        assert "../shared/DESIGN" not in page.read_text(), page


def imports_of(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


def package_of(module: str) -> str | None:
    """gateway.storage.lexical -> storage; gateway.restriction -> restriction."""
    parts = module.split(".")
    return parts[1] if parts[0] == "gateway" and len(parts) > 1 else None


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "gateway").rglob("*.py"):
        relative = path.relative_to(ROOT / "gateway").with_suffix("")
        own = relative.parts[0]
        uses = {package_of(m) for m in imports_of(path)} - {None, own}
        graph.setdefault(own, set()).update(p for p in uses if p is not None)
    return graph


def test_storage_imports_nothing_above_it() -> None:
    assert package_graph()["storage"] & {"retrieval", "answer", "api", "ingest", "cli"} == set()


def test_packages_import_each_other_without_cycles() -> None:
    graph = package_graph()
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        assert node not in path, f"import cycle: {' -> '.join([*path, node])}"
        if node in done:
            return
        for used in sorted(graph.get(node, ())):
            visit(used, [*path, node])
        done.add(node)

    for package in sorted(graph):
        visit(package, [])


def test_error_code_type_and_table_name_the_same_codes() -> None:
    assert list(get_args(ErrorCode)) == list(ERROR_CODES)
