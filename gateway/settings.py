"""Deployment settings: the only module that reads the environment."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.embedding.precision import PrecisionSetting
from gateway.placement import LaneCpus

TRACE_EXPORTERS = ("otlp", "console", "none")


def origin_key(origin: str) -> str:
    """A browser `Origin` as GATEWAY_ALLOWED_ORIGINS entries are compared with it (/mcp's
    refusal and the CORS of /mcp and /v1 alike): without a trailing slash, in any case."""
    return origin.rstrip("/").lower()


@functools.lru_cache(maxsize=16)
def origin_set(allowed_origins: str) -> frozenset[str]:
    """GATEWAY_ALLOWED_ORIGINS as the set `origin_key` looks an Origin up in."""
    return frozenset(origin_key(o.strip()) for o in allowed_origins.split(",") if o.strip())


class Settings(BaseSettings):
    """Everything a deployment configures; policy (who sees what, budgets) lives in YAML."""

    # An empty variable is unset, not a value: GATEWAY_POLICY_DIR="" (a deploy template left
    # blank) would otherwise be Path(""), the working directory, and its YAML files would be
    # served as the policy instead of the packaged default; the same for the data dir and
    # the reranker's model.
    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_", extra="ignore", frozen=True, env_ignore_empty=True
    )

    data_dir: Path = Field(default=Path("data"), description="Catalog, indexes and generations.")
    database_url: str = Field(
        default="",
        description="The catalog's database: empty for SQLite in the data dir, or "
        "postgresql+psycopg://user:password@host:port/db.",
    )
    index_uri: str = Field(
        default="",
        description="Where the index lives: empty for the data dir, or s3://bucket/prefix "
        "(with the AWS_* settings); the data dir then holds local copies.",
    )
    aws_endpoint_url: str = Field(
        default="", validation_alias="AWS_ENDPOINT_URL", description="An S3-compatible store."
    )
    aws_access_key_id: str = Field(default="", validation_alias="AWS_ACCESS_KEY_ID")
    aws_secret_access_key: SecretStr = Field(
        default=SecretStr(""), validation_alias="AWS_SECRET_ACCESS_KEY"
    )
    aws_region: str = Field(default="us-east-1", validation_alias="AWS_REGION")
    aws_allow_http: bool = Field(
        default=False, validation_alias="AWS_ALLOW_HTTP", description="Allow an http:// endpoint."
    )
    policy_dir: Path | None = Field(
        default=None, description="Policy YAML directory; the packaged default when unset."
    )
    oidc_issuer: str = Field(default="", description="Expected `iss` of caller tokens.")
    oidc_audience: str = Field(default="", description="Expected `aud` of caller tokens.")
    jwks_uri: str = Field(
        default="", description="https:// or file:// JWKS; when unset, OIDC discovery is used."
    )
    oidc_ca_file: Path | None = Field(
        default=None,
        description="A PEM bundle of the CAs that sign the issuer's https certificate "
        "(discovery, JWKS); unset: the system's trust store. For an issuer on a private CA.",
    )
    console_client_id: str = Field(
        default="",
        description="The console's OpenID Connect client (public, PKCE) at GATEWAY_OIDC_ISSUER, "
        "other than GATEWAY_OIDC_AUDIENCE; unset: the console takes pasted tokens only.",
    )
    console_scope: str = Field(
        default="openid",
        description="The scope the console asks for; add the one that makes the issuer put "
        "GATEWAY_OIDC_AUDIENCE in the access token's `aud` where it needs one.",
    )
    public_url: str = Field(
        default="",
        description="The gateway's externally visible base URL (https://host[:port][/prefix]); "
        "the MCP resource is <public_url>/mcp, an accepted `aud` at /mcp. Unset: the metadata "
        "document names the URL each request came to, and /mcp accepts only OIDC_AUDIENCE.",
    )
    allowed_origins: str = Field(
        default="",
        description="Comma-separated browser Origins that may call /mcp and /v1 (CORS: "
        "their preflights are answered and their pages may read the answers). At /mcp a "
        "request with any other Origin is 403 (DNS rebinding defence); at /v1 it is served "
        "without CORS headers. Requests without an Origin pass.",
    )
    jwt_leeway_s: int = Field(default=30, ge=0, le=60, description="Clock leeway for exp/nbf.")
    jwks_refresh_min_interval_s: float = Field(
        default=30.0, ge=0, description="Least time between two JWKS refetches on unknown kid."
    )
    jwks_refresh_interval_s: float = Field(
        default=300.0,
        ge=0,
        description="JWKS older than this is fetched again (keys the issuer removed stop "
        "working); 0: only on an unknown kid.",
    )
    http_timeout_s: float = Field(default=5.0, gt=0, description="Timeout for issuer calls.")
    policy_watch_interval_s: float = Field(
        default=2.0, ge=0, description="How often policy files are checked for changes; 0: never."
    )
    fast_queries: bool = Field(
        default=True, description="Embed queries with ONNX Runtime (same vectors, ~3x faster)."
    )
    lane_cpus: LaneCpus = Field(
        default="auto",
        description="Where the retrieval lanes' worker threads run: shared (anywhere, as the "
        "kernel places them), split (the dense lane's workers on the upper half of this "
        "process's CPUs, the BM25 and identifier lanes' and the audit writer on the lower "
        "half, BM25's whole-document workers anywhere), or auto "
        "(split for a process serving alone on exactly two CPUs, where split cut /search "
        'p95; shared otherwise). docs/operations.md, "Settings".',
    )
    warm_index: Literal["auto", "off"] = Field(
        default="auto",
        description="Make each index generation ready for its first searches: the one served "
        "at startup before /readyz says ready, later ones in the background once served. "
        "Its partitions opened, its Tantivy files read and its vector copy's mappings "
        "populated, as much as fits in half the available memory; off: leave that to the "
        "first searches.",
    )
    serve_processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Processes `gateway serve` answers from, on one port (`--processes`): each "
        "has its own GIL, and they share rate limits, metrics, policy reloads and the writer's "
        'liveness; docs/operations.md, "Several processes on one host".',
    )
    embedding_precision: PrecisionSetting = Field(
        default="auto",
        description=(
            "Numerics of passage embedding: auto (a CUDA device, else bfloat16 where the CPU "
            "has AMX or AVX-512 BF16, else float32), or float32 / bfloat16 forced. bfloat16 "
            "forced on a CPU without either is emulated, several times slower than float32: "
            "accepted, with a warning at start. With auto, queries are embedded in int8 where "
            "the CPU has int8 dot products (VNNI, AMX); otherwise in float32."
        ),
    )
    embedding_threads: int | None = Field(
        default=None,
        ge=1,
        le=512,
        description=(
            "Threads torch embeds passages with in `gateway worker` (and --embed-only); "
            "unset: torch's default (every core). Several embedders on one host: cores / N."
        ),
    )
    embed_claim_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "A slice claimed by an embedding process (`gateway worker --embed-only`) or the "
            "writer is taken over by another once its heartbeat is this old (a crashed "
            "embedder's slice is embedded again)."
        ),
    )
    model_cache_dir: Path | None = Field(
        default=None, description="Where the ONNX export of the model is kept; <data_dir>/models."
    )
    rerank_model: Path | None = Field(
        default=None,
        description="Directory of a sentence-transformers cross-encoder; unset: no reranking.",
    )
    llm_base_url: str = Field(
        default="",
        description="An OpenAI-compatible endpoint (…/v1); with llm_model set, answers by LLM.",
    )
    llm_api_key: SecretStr = Field(
        default=SecretStr(""), description="Its API key; empty for servers that need none."
    )
    llm_model: str = Field(default="", description="The model asked, unless the policy picks.")
    dev_issuer: bool = Field(
        default=False,
        description="Trust the local development issuer's keys in the data dir (demo only).",
    )

    # Tracing: the standard OpenTelemetry variables, read here like every other setting.
    otel_traces_exporter: str = Field(
        default="none",
        validation_alias="OTEL_TRACES_EXPORTER",
        description="Comma-separated, as the OpenTelemetry spec reads it: otlp, console, none.",
    )
    otel_service_name: str = Field(default="rag-gateway", validation_alias="OTEL_SERVICE_NAME")
    otel_exporter_otlp_endpoint: str = Field(
        default="http://localhost:4318", validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    otel_exporter_otlp_traces_endpoint: str = Field(
        default="", validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: str) -> str:
        scheme = urlsplit(value).scheme
        if value and scheme not in ("postgresql+psycopg", "sqlite"):
            raise ValueError(  # the value may hold a password: not repeated here
                "must be a postgresql+psycopg://… or sqlite:///… URL (empty: SQLite in "
                "the data dir)"
            )
        return value

    @field_validator("index_uri")
    @classmethod
    def _known_index_store(cls, value: str) -> str:
        parts = urlsplit(value)
        if value and (parts.scheme != "s3" or not parts.netloc):
            raise ValueError("must be s3://bucket/prefix (empty: the index in the data dir)")
        return value

    @model_validator(mode="after")
    def _plain_http_only_if_allowed(self) -> Settings:
        # Only when the index is on a store: other tools' AWS_* settings are not ours.
        plain = urlsplit(self.aws_endpoint_url).scheme == "http"
        if self.index_uri and plain and not self.aws_allow_http:
            raise ValueError("AWS_ENDPOINT_URL is plain http://: set AWS_ALLOW_HTTP=true to use it")
        return self

    @field_validator("jwks_uri")
    @classmethod
    def _authenticated_jwks(cls, value: str) -> str:
        # Keys fetched over plain http could be swapped by anyone on the path.
        if value and urlsplit(value).scheme not in ("https", "file"):
            raise ValueError("must be an https:// or file:// URI")
        return value

    @model_validator(mode="after")
    def _discovery_over_https(self) -> Settings:
        if self.oidc_issuer and not self.jwks_uri:
            scheme = urlsplit(self.oidc_issuer).scheme
            if scheme != "https":
                raise ValueError(
                    "GATEWAY_OIDC_ISSUER must be an https:// URL for OIDC discovery, "
                    "or set GATEWAY_JWKS_URI (https:// or file://)"
                )
        return self

    @field_validator("oidc_ca_file")
    @classmethod
    def _ca_file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError("no such file: a PEM file of CA certificates")
        return value

    @model_validator(mode="after")
    def _console_needs_an_issuer(self) -> Settings:
        if self.console_client_id and urlsplit(self.oidc_issuer).scheme != "https":
            raise ValueError(
                "GATEWAY_CONSOLE_CLIENT_ID needs GATEWAY_OIDC_ISSUER, an https:// URL: the "
                "console signs in there"
            )
        # An ID token's `aud` is the client it was issued to: with the API's audience the
        # same, every ID token the console gets (and keeps, to end the provider's session)
        # would be a bearer token for the whole API.
        if self.console_client_id and self.console_client_id == self.oidc_audience:
            raise ValueError(
                "GATEWAY_CONSOLE_CLIENT_ID must differ from GATEWAY_OIDC_AUDIENCE: the "
                "console's ID tokens name its client ID as their audience, and would be "
                "taken as bearer tokens"
            )
        return self

    @field_validator("public_url")
    @classmethod
    def _plain_base_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if value and (
            parts.scheme not in ("http", "https")
            or not parts.netloc
            or parts.query
            or parts.fragment
        ):
            raise ValueError("must be an http(s)://host[:port][/prefix] URL without ? or #")
        return value.rstrip("/")

    @field_validator("otel_traces_exporter")
    @classmethod
    def _known_exporters(cls, value: str) -> str:
        unknown = sorted({k.strip().lower() for k in value.split(",")} - {*TRACE_EXPORTERS, ""})
        if unknown:
            raise ValueError(f"unknown exporter {', '.join(unknown)}; expected otlp, console, none")
        return value

    @property
    def llm_enabled(self) -> bool:
        return bool(self.llm_base_url and self.llm_model)

    @property
    def mcp_resource(self) -> str | None:
        """The MCP resource's URI (RFC 8707), known only from GATEWAY_PUBLIC_URL: never from
        a request's Host, which a caller chooses."""
        return f"{self.public_url}/mcp" if self.public_url else None

    @property
    def allowed_origin_set(self) -> frozenset[str]:
        # Asked on every /mcp request: the set is built once per value. Not cached on the
        # object: `model_copy(update=...)` copies a cached value along, however stale.
        return origin_set(self.allowed_origins)

    @property
    def trace_exporters(self) -> set[str]:
        """The exporters to run: "none" alone, or beside others, exports nothing by itself."""
        return {k.strip().lower() for k in self.otel_traces_exporter.split(",")} - {"none", ""}
