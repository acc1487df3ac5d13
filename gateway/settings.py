"""Deployment settings: the only module that reads the environment."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything a deployment configures; policy (who sees what, budgets) lives in YAML."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="ignore", frozen=True)

    data_dir: Path = Field(default=Path("data"), description="Catalog, indexes and generations.")
    policy_dir: Path | None = Field(
        default=None, description="Policy YAML directory; the packaged default when unset."
    )
    oidc_issuer: str = Field(default="", description="Expected `iss` of caller tokens.")
    oidc_audience: str = Field(default="", description="Expected `aud` of caller tokens.")
    jwks_uri: str = Field(
        default="", description="https:// or file:// JWKS; when unset, OIDC discovery is used."
    )
    jwt_leeway_s: int = Field(default=30, ge=0, le=60, description="Clock leeway for exp/nbf.")
    jwks_refresh_min_interval_s: float = Field(
        default=30.0, ge=0, description="Least time between two JWKS refetches on unknown kid."
    )
    http_timeout_s: float = Field(default=5.0, gt=0, description="Timeout for issuer calls.")
