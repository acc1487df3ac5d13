"""What the deployment files set, read back for the tests."""

from __future__ import annotations

from typing import Any

from gateway.settings import Settings


def service_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(key): "" if value is None else str(value) for key, value in env.items()}


def settings_env_names() -> set[str]:
    """The environment names Settings reads, derived from its fields (they grow over time)."""
    prefix = Settings.model_config.get("env_prefix", "")
    names: set[str] = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias or field.alias
        if alias is None:
            names.add(f"{prefix}{name}".upper())
        elif isinstance(alias, str):
            names.add(alias.upper())
        else:  # AliasChoices
            names.update(str(choice).upper() for choice in alias.choices)
    return names
