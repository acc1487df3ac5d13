"""Settings of the catalog database and the index store: bad values stop a command at
start, with the reason; other tools' AWS_* settings are not the gateway's business."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.settings import Settings


def test_only_known_databases_and_stores_are_accepted() -> None:
    with pytest.raises(ValidationError, match="postgresql\\+psycopg"):
        Settings(database_url="mysql://user:secret@db/x")
    with pytest.raises(ValidationError, match="s3://bucket/prefix"):
        Settings(index_uri="gs://bucket/prefix")
    assert Settings(database_url="postgresql+psycopg://u@h/d").database_url.startswith("postgres")


def test_a_plain_http_store_needs_allow_http_only_when_the_index_is_on_it() -> None:
    assert Settings(aws_endpoint_url="http://127.0.0.1:8333").index_uri == ""
    with pytest.raises(ValidationError, match="AWS_ALLOW_HTTP"):
        Settings(aws_endpoint_url="http://127.0.0.1:8333", index_uri="s3://b/p")
    allowed = Settings(
        aws_endpoint_url="http://127.0.0.1:8333", index_uri="s3://b/p", aws_allow_http=True
    )
    assert allowed.aws_allow_http


def test_a_refused_database_url_is_not_repeated_in_the_error() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(database_url="mysql://user:hunter2@db/x")
    assert "hunter2" not in str(refused.value.errors()[0]["msg"])
