"""A replica copies a generation's objects only to inside its staging directory: a key
that would leave it (`..`, absolute, backslashes, NUL) fails the whole fetch before a
byte is written, on a real S3-compatible store (SeaweedFS on loopback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from gateway.errors import GatewayError
from gateway.storage.objects import PUBLISHED, ObjectStore, staged_path
from tests.helpers.seaweed import BUCKET, S3Store

GENERATION = "lexical/g000002"
ESCAPING = "../../../escaped.txt"


class HostileListing:
    """The store's filesystem, whose listing also has an object named `ESCAPING` (with
    the bytes of `meta.json`). SeaweedFS refuses such keys (400); AWS S3 takes them, so
    the listing is where the bucket's writer puts it here."""

    def __init__(self, real: pafs.S3FileSystem, root: str) -> None:
        self.real, self.hostile = real, root + ESCAPING
        self.opened: list[str] = []

    def get_file_info(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        listing = list(self.real.get_file_info(selector))
        return [*listing, pafs.FileInfo(self.hostile, type=pafs.FileType.File, size=2)]

    def open_input_stream(self, path: str) -> Any:
        self.opened.append(path)
        real = path.replace(ESCAPING, "meta.json") if path == self.hostile else path
        return self.real.open_input_stream(real)


def test_a_key_out_of_the_generation_fails_the_fetch_and_writes_nothing(
    s3: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = s3.object_store()
    published = tmp_path / "writer" / GENERATION
    published.mkdir(parents=True)
    (published / "meta.json").write_text("{}")
    (published / f"{'a' * 32}.idx").write_bytes(b"segment")
    store.publish(published, GENERATION)
    replica = tmp_path / "replica" / "data"
    local = replica / GENERATION
    local.parent.mkdir(parents=True)

    real_fs = store._fs()
    hostile = HostileListing(real_fs, f"{BUCKET}/{store.prefix}/{GENERATION}/")
    monkeypatch.setattr(ObjectStore, "_fs", lambda self: hostile)
    with pytest.raises(GatewayError) as refused:
        store.fetch(GENERATION, local)
    assert refused.value.code == "index_invalid" and not refused.value.transient
    assert "leaves its generation's directory" in refused.value.detail
    assert "escaped" not in refused.value.detail  # the key's text is never repeated
    assert hostile.opened == []  # checked before the first byte was copied
    assert list(tmp_path.rglob("escaped.txt")) == []
    assert list(local.parent.iterdir()) == []  # no copy, no staging directory left

    monkeypatch.undo()  # the same generation, listed as it is, copies whole
    store.fetch(GENERATION, local)
    copied = sorted(p.name for p in local.iterdir())
    assert copied == [PUBLISHED, f"{'a' * 32}.idx", "meta.json"]  # marked a committed copy


ROOT = "bucket/prefix/lexical/g000002/"


@pytest.mark.parametrize(
    "key",
    [
        ROOT + "../g000001/meta.json",
        ROOT + "a/../../escaped",
        ROOT + "..",
        ROOT + "/etc/cron.d/x",  # absolute once the root is taken off
        ROOT + "a//b",
        ROOT + "./meta.json",
        ROOT + "a\\..\\..\\escaped",
        ROOT + "meta\x00.json",
        ROOT,
        "bucket/prefix/lexical/g000003/meta.json",  # not under the generation at all
    ],
)
def test_a_key_that_would_leave_the_staging_directory_is_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(GatewayError) as refused:
        staged_path(tmp_path, ROOT, key)
    assert refused.value.code == "index_invalid"


def test_a_key_through_a_link_out_of_the_staging_directory_is_refused(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "link").symlink_to(tmp_path)
    with pytest.raises(GatewayError):
        staged_path(staging, ROOT, ROOT + "link/escaped")


def test_keys_inside_the_generation_are_placed_under_it(tmp_path: Path) -> None:
    for relative in ("meta.json", "..hidden", "a/b/c.idx", "x..y"):
        assert staged_path(tmp_path, ROOT, ROOT + relative) == tmp_path / relative
