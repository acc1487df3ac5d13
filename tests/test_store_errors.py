"""An object store that answers but refuses the configuration (a wrong key, a missing
bucket) says so, naming the setting to fix, instead of "cannot be reached"; it stays 503
`not_ready` (transient), as a store away is, so that a job waits for the fix instead of
failing with its documents dropped. Against SeaweedFS on loopback, as LanceDB meets it."""

from __future__ import annotations

import pytest

from gateway.bench.server import free_port
from gateway.errors import GatewayError
from gateway.storage.vectors import VectorStore, store_outage_is_not_ready
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
