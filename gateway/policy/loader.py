"""Load a policy directory: YAML files merged in name order, validated, content-hashed."""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

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
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    problems: list[str] = []
    digest = hashlib.sha256()
    for path in files:
        raw = path.read_bytes()
        digest.update(path.name.encode() + b"\0" + raw + b"\0")
        try:
            data = yaml.safe_load(raw) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problems.append(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}")
            continue
        if not isinstance(data, dict):
            problems.append(f"{path}: the top level must be a mapping of policy keys")
            continue
        for key, value in data.items():
            if key in merged:
                problems.append(f"{path}: {key}: already set in {origin[key]}")
                continue
            merged[key], origin[key] = value, path.name
    try:
        policy = Policy.model_validate(merged)
    except ValidationError as exc:
        for error in exc.errors():
            location = ".".join(str(part) for part in error["loc"])
            source = origin.get(str(error["loc"][0]), directory.name) if error["loc"] else ""
            problems.append(f"{directory / source}: {location}: {error['msg']}")
    if problems:
        raise GatewayError("invalid_policy", "\n".join(problems))
    return LoadedPolicy(policy, digest.hexdigest()[:16], tuple(p.name for p in files))


def load_policy_files(files: Mapping[str, str]) -> LoadedPolicy:
    """A policy sent as text (file name -> YAML), loaded exactly as the same files in a
    directory would be; problems name the files as sent."""
    problems = [
        f"{name}: not a policy file name (*.yaml or *.yml, no directory)"
        for name in sorted(files)
        if not _FILE_NAME.fullmatch(name)
    ]
    if problems:
        raise GatewayError("invalid_policy", "\n".join(problems), extra={"problems": problems})
    with tempfile.TemporaryDirectory(prefix="policy-preview-") as directory:
        root = Path(directory)
        for name, text in files.items():
            (root / name).write_text(text, encoding="utf-8")
        try:
            return load_policy(root)
        except GatewayError as exc:
            detail = exc.detail.replace(f"{root}/", "").replace(str(root), "policy")
            problems = detail.split("\n")
            raise GatewayError("invalid_policy", detail, extra={"problems": problems}) from None


def policy_schema() -> str:
    """The JSON schema of policy files, as checked in at `policies/schema.json`."""
    schema = Policy.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Gateway policy (all files of a policy directory, merged)"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
