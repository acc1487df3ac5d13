"""Policy directories the tests write: the shipped default with a change or two."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gateway.policy.loader import DEFAULT_POLICY_DIR


def write_policy(directory: Path, **changes: Any) -> Path:
    policy = yaml.safe_load((DEFAULT_POLICY_DIR / "policy.yaml").read_text())
    policy["nested_groups"] = {"ops": ["gateway-admins"], "risk-eu": ["merchant-risk"]}
    policy["admins"] = {"subjects": [], "groups": ["gateway-admins"]}
    policy["operators"] = {"tenant": "acme", "groups": ["gateway-admins"]}
    policy["grants"] = [{"group": "staff", "grants": ["support:eu"]}]
    policy.update(changes)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "policy.yaml").write_text(yaml.safe_dump(policy))
    return directory


TOO_SHORT_MS = 0.001  # no thread hop, let alone a model call, finishes in a microsecond


def policy_with_budgets(tmp_path: Path, **budgets: float) -> Path:
    policy = yaml.safe_load((DEFAULT_POLICY_DIR / "policy.yaml").read_text())
    policy["budgets"].update(budgets)
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    return tmp_path
