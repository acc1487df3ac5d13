"""An object store that answers but refuses the configuration (a wrong key, a missing
bucket) says so, naming the setting to fix, instead of "cannot be reached"; it stays 503
`not_ready` (transient), as a store away is, so that a job waits for the fix instead of
failing with its documents dropped. Against SeaweedFS on loopback, as LanceDB meets it
and as pyarrow does for the Tantivy files."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from gateway.api.app import create_app
from gateway.bench.server import free_port
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.pipeline import ingest_paths
from gateway.settings import Settings
from gateway.storage.layout import DataLayout
from gateway.storage.objects import ObjectStore
from gateway.storage.vectors import VectorStore, store_outage_is_not_ready
from tests.helpers.documents import write_corpus
from tests.helpers.identity import make_settings
from tests.helpers.seaweed import KEY, SECRET, S3Store

pytestmark = pytest.mark.server


def lance_error(s3: S3Store, uri: str, key: str, secret: str, endpoint: str = "") -> GatewayError:
    options = {
        "aws_region": "us-east-1",
        "aws_endpoint": endpoint or s3.endpoint,
        "aws_access_key_id": key,
        "aws_secret_access_key": secret,
        "allow_http": "true",
        "client_max_retries": "0",
    }
    store = VectorStore(uri, 384, version=1, options=options)
    with pytest.raises(GatewayError) as raised, store_outage_is_not_ready():
        store.snapshot()
    return raised.value


@pytest.mark.parametrize(
    ("bucket", "key", "secret", "named", "setting"),
    [
        ("gateway", KEY, "not-the-secret", "SignatureDoesNotMatch", "AWS_SECRET_ACCESS_KEY"),
        ("gateway", "nobody-knows-me", SECRET, "InvalidAccessKeyId", "AWS_ACCESS_KEY_ID"),
        ("no-such-bucket", KEY, SECRET, "NoSuchBucket", "GATEWAY_INDEX_URI"),
    ],
)
def test_a_store_refusing_the_configuration_says_what_to_fix(
    s3: S3Store, bucket: str, key: str, secret: str, named: str, setting: str
) -> None:
    error = lance_error(s3, f"s3://{bucket}/some-prefix/vectors", key, secret)
    assert error.code == "not_ready" and error.transient  # waited for, never a job's fault
    assert named in error.detail and setting in error.detail
    assert "cannot be reached" not in error.detail
    for secret_or_address in (secret, key, bucket, s3.endpoint.removeprefix("http://")):
        assert secret_or_address not in error.detail


def test_a_store_away_is_still_not_ready(s3: S3Store) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    error = lance_error(s3, "s3://gateway/some-prefix/vectors", KEY, SECRET, endpoint=dead)
    assert error.code == "not_ready" and error.transient
    assert "cannot be reached" in error.detail


def pyarrow_error(
    endpoint: str, uri: str, key: str, secret: str, publish: bool, tmp: Path
) -> GatewayError:
    """What the gateway says when pyarrow fetches or publishes a Tantivy generation."""
    store = ObjectStore.from_uri(
        uri, endpoint=endpoint, access_key=key, secret_key=secret, allow_http=True
    )
    built = tmp / "built"
    built.mkdir()
    (built / "meta.json").write_text("{}")
    with pytest.raises(GatewayError) as raised:
        if publish:
            store.publish(built, "lexical/g000001")
        else:
            store.fetch("lexical/g000001", tmp / "copy")
    return raised.value


@pytest.mark.parametrize("publish", [False, True], ids=["fetch", "publish"])
@pytest.mark.parametrize(
    ("key", "secret", "named", "setting"),
    [
        (KEY, "not-the-secret", "SignatureDoesNotMatch", "AWS_SECRET_ACCESS_KEY"),
        ("nobody-knows-me", SECRET, "InvalidAccessKeyId", "AWS_ACCESS_KEY_ID"),
    ],
)
def test_tantivy_files_refused_a_key_say_what_to_fix(
    s3: S3Store, tmp_path: Path, key: str, secret: str, named: str, setting: str, publish: bool
) -> None:
    """pyarrow's errors were all "cannot be reached; retry shortly", a wrong key too."""
    error = pyarrow_error(s3.endpoint, s3.new_prefix(), key, secret, publish, tmp_path)
    assert error.code == "not_ready" and error.transient
    assert named in error.detail and setting in error.detail
    assert "cannot be reached" not in error.detail
    for secret_or_address in (secret, key, s3.endpoint.removeprefix("http://")):
        assert secret_or_address not in error.detail


def test_tantivy_files_in_a_missing_bucket_say_what_to_fix(s3: S3Store, tmp_path: Path) -> None:
    # Fetched only: SeaweedFS makes a bucket that an admin key writes to.
    uri = "s3://no-such-tantivy-bucket/some-prefix"
    error = pyarrow_error(s3.endpoint, uri, KEY, SECRET, False, tmp_path)
    assert error.code == "not_ready" and error.transient
    assert "NoSuchBucket" in error.detail and "GATEWAY_INDEX_URI" in error.detail
    assert "no-such-tantivy-bucket" not in error.detail
    assert "cannot be reached" not in error.detail


@pytest.mark.parametrize("publish", [False, True], ids=["fetch", "publish"])
def test_tantivy_files_on_a_store_away_are_still_not_ready(
    s3: S3Store, tmp_path: Path, publish: bool
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    error = pyarrow_error(dead, s3.new_prefix(), KEY, SECRET, publish, tmp_path)
    assert error.code == "not_ready" and error.transient
    assert "cannot be reached" in error.detail


def test_a_replica_with_a_wrong_secret_says_so_at_startup(
    s3: S3Store, tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> None:
    """The writer publishes with the right key; a replica with a wrong secret fetches the
    generation's Tantivy files at startup, and the operator reads which setting to fix."""
    prefix = s3.new_prefix()
    catalog = f"sqlite:///{(tmp_path / 'writer' / 'catalog.db').resolve()}"

    def settings(root: Path, secret: str) -> Settings:
        return make_settings(root, jwks_file).model_copy(
            update={
                "database_url": catalog,
                "index_uri": prefix,
                "aws_endpoint_url": s3.endpoint,
                "aws_access_key_id": KEY,
                "aws_secret_access_key": SecretStr(secret),
                "aws_allow_http": True,
            }
        )

    writer = DataLayout.configured(settings(tmp_path / "writer", SECRET))
    ingest_paths([write_corpus(tmp_path / "corpus")], writer, embedder)
    replica = settings(tmp_path / "replica", "not-the-secret")
    with pytest.raises(GatewayError) as raised, TestClient(create_app(replica, embedder=embedder)):
        pass  # the served generation is opened at startup
    detail = raised.value.detail
    assert raised.value.code == "not_ready"
    assert "AWS_SECRET_ACCESS_KEY" in detail and "cannot be reached" not in detail
    assert "not-the-secret" not in detail
