"""Load a policy directory: YAML files merged in name order, validated, content-hashed."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.errors import GatewayError
from gateway.policy.model import Policy

DEFAULT_POLICY_DIR = Path(__file__).resolve().parent.parent / "defaults"


@dataclass(frozen=True)
class LoadedPolicy:
    policy: Policy
    version: str  # content hash of the files, so every decision names what decided it
    files: tuple[str, ...]


def load_policy(directory: Path | None) -> LoadedPolicy:
    """Every *.yaml / *.yml in the directory; top-level keys may not repeat across files."""
    directory = directory or DEFAULT_POLICY_DIR
    files = sorted(p for p in directory.glob("*.y*ml") if p.suffix in {".yaml", ".yml"})
    if not files:
        raise GatewayError("invalid_policy", f"{directory}: no policy files (*.yaml)")
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    digest = hashlib.sha256()
    for path in files:
        raw = path.read_bytes()
        digest.update(path.name.encode() + b"\0" + raw + b"\0")
        try:
            data = yaml.safe_load(raw) or {}
        except yaml.YAMLError as exc:
            raise GatewayError("invalid_policy", f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise GatewayError("invalid_policy", f"{path}: top level must be a mapping")
        for key, value in data.items():
            if key in merged:
                raise GatewayError(
                    "invalid_policy", f"{path}: key {key!r} already set in {origin[key]}"
                )
            merged[key], origin[key] = value, path.name
    try:
        policy = Policy.model_validate(merged)
    except ValidationError as exc:
        problems = "; ".join(
            f"{origin.get(str(e['loc'][0]), directory.name) if e['loc'] else directory.name}: "
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            for e in exc.errors()
        )
        raise GatewayError("invalid_policy", problems) from exc
    return LoadedPolicy(policy, digest.hexdigest()[:16], tuple(p.name for p in files))
