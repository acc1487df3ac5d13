"""Settings from the environment: an empty variable is an unset one."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.loader import load_policy
from gateway.settings import Settings


def test_an_empty_policy_dir_serves_the_packaged_default_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GATEWAY_POLICY_DIR="" (a deploy template's blank) was Path(""): the YAML files of
    whatever directory the server started in were served as the policy."""
    (tmp_path / "policy.yaml").write_text("admins: {groups: [everyone]}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GATEWAY_POLICY_DIR", "")
    settings = Settings()
    assert settings.policy_dir is None
    assert load_policy(settings.policy_dir).policy.admins.groups == ()


@pytest.mark.parametrize(
    ("variable", "field", "default"),
    [
        ("GATEWAY_DATA_DIR", "data_dir", Path("data")),
        ("GATEWAY_RERANK_MODEL", "rerank_model", None),  # Path(""): reranking from "."
        ("GATEWAY_MODEL_CACHE_DIR", "model_cache_dir", None),
        ("GATEWAY_EMBEDDING_THREADS", "embedding_threads", None),  # was a refusal
    ],
)
def test_an_empty_variable_is_the_default(
    monkeypatch: pytest.MonkeyPatch, variable: str, field: str, default: object
) -> None:
    monkeypatch.setenv(variable, "")
    assert getattr(Settings(), field) == default


def test_a_variable_that_is_set_still_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_POLICY_DIR", str(tmp_path))
    monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "data"))
    settings = Settings()
    assert (settings.policy_dir, settings.data_dir) == (tmp_path, tmp_path / "data")


def test_a_bad_value_is_named_by_the_variable_that_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator set GATEWAY_JWT_LEEWAY_S, not `jwt_leeway_s`: the refusal names what to
    change; a variable without the prefix (AWS_ALLOW_HTTP) keeps its own name."""
    from typer.testing import CliRunner

    from gateway.cli import app

    monkeypatch.setenv("GATEWAY_JWT_LEEWAY_S", "61")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "maybe")
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == 1
    assert result.output.startswith("invalid settings: ")
    assert "GATEWAY_JWT_LEEWAY_S: Input should be less than or equal to 60" in result.output
    assert "AWS_ALLOW_HTTP: Input should be a valid boolean" in result.output
