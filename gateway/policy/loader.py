"""Load a policy directory: YAML files merged in name order, validated, content-hashed."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway import yamlload
from gateway.errors import GatewayError
from gateway.policy.model import Policy

DEFAULT_POLICY_DIR = Path(__file__).resolve().parent.parent / "defaults"
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.ya?ml")


@dataclass(frozen=True)
class LoadedPolicy:
    policy: Policy
    version: str  # content hash of the files, so every decision names what decided it
    files: tuple[str, ...]


def policy_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.y*ml") if p.suffix in {".yaml", ".yml"})


def load_policy(directory: Path | None) -> LoadedPolicy:
    """Every *.yaml / *.yml in the directory; top-level keys may not repeat across files.

    Every problem in every file is reported (one per line: file, key, what is wrong), not
    only the first, so one run of `gateway policy check` shows all there is to fix."""
    directory = directory or DEFAULT_POLICY_DIR
    if not directory.is_dir():
        raise GatewayError("invalid_policy", f"{directory}: not a directory")
    files = policy_files(directory)
    if not files:
        raise GatewayError("invalid_policy", f"{directory}: no policy files (*.yaml)")
    sources, unreadable = [], []
    for path in files:
        try:
            sources.append((str(path), path.name, path.read_bytes()))
        except OSError as exc:  # a directory named *.yaml, a file gone mid-deploy, no access
            unreadable.append(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})")
    return _load_sources(sources, str(directory), unreadable)


def _load_sources(
    sources: list[tuple[str, str, bytes]], where: str, problems: list[str] | None = None
) -> LoadedPolicy:
    """(shown as, file name, content) in name order -> the merged, validated policy;
    `problems` already found (files that could not be read) are reported with the rest."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}  # key -> the file that set it, as shown
    problems = list(problems or [])
    digest = hashlib.sha256()
    for shown, name, raw in sources:
        digest.update(name.encode() + b"\0" + raw + b"\0")
        try:
            data = yamlload.load_policy_yaml(raw)
        except yaml.YAMLError as exc:
            problems.append(f"{shown}: not valid YAML{yamlload.yaml_problem(exc)}")
            continue
        if data is None:
            # A file emptied by a failed deploy or a truncating editor would otherwise be
            # served as every default, audit and limits included; `{}` says it on purpose.
            problems.append(
                f"{shown}: empty (no YAML document); write {{}} for a file that sets nothing"
            )
            continue
        if not isinstance(data, dict):
            problems.append(f"{shown}: the top level must be a mapping of policy keys")
            continue
        for key, value in data.items():
            if key in merged:
                problems.append(f"{shown}: {key}: already set in {Path(origin[key]).name}")
                continue
            merged[key], origin[key] = value, shown
    try:
        policy = Policy.model_validate(merged)
    except ValidationError as exc:
        for error in exc.errors():
            location = ".".join(str(part) for part in error["loc"])
            source = origin.get(str(error["loc"][0]), where) if error["loc"] else where
            problems.append(f"{source}: {location}: {error['msg']}")
    if problems:
        raise GatewayError("invalid_policy", "\n".join(problems))
    return LoadedPolicy(policy, digest.hexdigest()[:16], tuple(name for _, name, _ in sources))


def load_policy_files(files: Mapping[str, str]) -> LoadedPolicy:
    """A policy sent as text (file name -> YAML), loaded exactly as the same files in a
    directory would be; problems name the files as sent."""
    problems = [
        f"{_shown(name)}: not a policy file name (*.yaml or *.yml, no directory)"
        for name in sorted(files)
        if not _FILE_NAME.fullmatch(name)
    ]
    sources = []
    for name in sorted(files):
        try:
            sources.append((name, name, files[name].encode("utf-8")))
        except UnicodeEncodeError as exc:  # a lone surrogate, which JSON can carry
            problems.append(f"{_shown(name)}: not text: an unpaired surrogate at {exc.start}")
    if problems:
        raise GatewayError("invalid_policy", "\n".join(problems), extra={"problems": problems})
    try:
        return _load_sources(sources, "policy")
    except GatewayError as exc:
        problems = exc.detail.split("\n")
        raise GatewayError("invalid_policy", exc.detail, extra={"problems": problems}) from None


def _shown(name: str) -> str:
    """A file name as sent, or escaped when it could not be shown (or encoded) as it is."""
    return name if name.isprintable() and name.isascii() else ascii(name)


def policy_schema() -> str:
    """The JSON schema of policy files, as checked in at `policies/schema.json`."""
    schema = Policy.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Gateway policy (all files of a policy directory, merged)"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
