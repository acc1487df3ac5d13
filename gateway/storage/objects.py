"""Index generations on S3-compatible object storage (`GATEWAY_INDEX_URI=s3://bucket/prefix`).

The LanceDB table lives on the bucket itself (`<prefix>/vectors`): LanceDB reads and
writes it there, each change a new table version. A Tantivy generation is built by the
writer in its local data dir and published as an immutable set of files under
`<prefix>/lexical/gNNNNNN/` before the catalog commit that makes it current; a replica
copies a generation to its own local disk before opening it (Tantivy needs a writable
directory), taking from the generation it already has every file of the same name and
size among Tantivy's segment files (which never change once written), as Lucene's
replicator does. Old
generations are removed from the bucket once no replica serves them.

Whoever can write to the bucket chooses the keys a replica copies, so each key must name
a file inside the staging directory (`staged_path`): a key that is absolute, has an empty,
`.` or `..` segment, a backslash or a NUL fails the whole fetch before anything is
written (`index_invalid`); the replica keeps its data dir as it was.

pyarrow's S3 filesystem does the copying: no second S3 client.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from gateway.errors import GatewayError
from gateway.storage.rows import ROWS_FILE

# Tantivy's segment files (`<segment uuid>.<part>`, deletes `<uuid>.<opstamp>.del`) never
# change once written, nor do the rows files named by their digest (gateway/storage/rows.py);
# meta.json and .managed.json are rewritten by every commit, and may well keep their size.
_SEGMENT_FILE = re.compile(r"[0-9a-f]{32}\.")
# A fetch is staged in `.fetch-<pid>-<random>` beside the generation it makes. A process
# killed mid-fetch leaves it, holding a generation's text (copies, or hard links that keep
# older generations' files on disk after their removal): `abandoned_fetch` finds it.
FETCHING = ".fetch-"
# A staging directory named before the pid was in its name is abandoned after this long.
UNNAMED_FETCH_S = 3600.0


# In the store, written under a generation after its files, so that one with no files at
# all (the last document of the last tenant erased) is still there: a replica makes it an
# empty directory instead of waiting for files that will never come. In a data dir, the
# mark of a committed generation's copy (`DataLayout.local_lexical`): made by a fetch, or
# by the writer once its commit names the generation, never copied from another one.
PUBLISHED = ".published"


@dataclass(frozen=True)
class ObjectStore:
    bucket: str
    prefix: str  # without slashes at either end; may be empty
    endpoint: str = ""  # e.g. http://127.0.0.1:8333; empty: AWS itself
    access_key: str = ""
    secret_key: str = ""
    region: str = "us-east-1"
    allow_http: bool = False

    @classmethod
    def from_uri(cls, uri: str, **credentials: object) -> ObjectStore:
        parts = urlsplit(uri)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError("must be s3://bucket/prefix")
        return cls(parts.netloc, parts.path.strip("/"), **credentials)  # type: ignore[arg-type]

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.bucket, self.prefix, *parts) if p)

    @property
    def vectors_uri(self) -> str:
        return "s3://" + self._key("vectors")

    @property
    def lance_options(self) -> dict[str, str]:
        """LanceDB's storage options: explicit, so that no credential chain probes an
        instance-metadata address."""
        options = {"aws_region": self.region}
        if self.endpoint:
            options["aws_endpoint"] = self.endpoint
        if self.access_key:
            options["aws_access_key_id"] = self.access_key
            options["aws_secret_access_key"] = self.secret_key
        if self.allow_http:
            options["allow_http"] = "true"
        return options

    def _fs(self) -> pafs.S3FileSystem:
        parts = urlsplit(self.endpoint) if self.endpoint else None
        return pafs.S3FileSystem(
            access_key=self.access_key or None,
            secret_key=self.secret_key or None,
            region=self.region,
            endpoint_override=parts.netloc if parts else None,
            scheme=parts.scheme if parts else "https",
            connect_timeout=5,
            request_timeout=30,
        )

    def publish(self, local: Path, name: str) -> None:
        """Upload the files of a local directory under `name/`, keeping its layout."""
        fs = self._fs()
        try:
            for path in sorted(p for p in local.rglob("*") if p.is_file()):
                relative = path.relative_to(local).as_posix()
                with (
                    path.open("rb") as source,
                    fs.open_output_stream(self._key(name, relative)) as target,
                ):
                    shutil.copyfileobj(source, target, 1 << 20)
            with fs.open_output_stream(self._key(name, PUBLISHED)) as marker:
                marker.write(b"published\n")
        except OSError as exc:
            raise _store_error(exc) from None

    def fetch(self, name: str, local: Path, reuse: Path | None = None) -> None:
        """Copy `name/` to the local directory `local` (made whole, then renamed into
        place), hard-linking from `reuse` every file it has with the same name and size."""
        fs = self._fs()
        staging = Path(tempfile.mkdtemp(prefix=f"{FETCHING}{os.getpid()}-", dir=local.parent))
        try:
            listing = fs.get_file_info(pafs.FileSelector(self._key(name), recursive=True))
            files = [i for i in listing if i.type == pafs.FileType.File]
            if not files:
                raise GatewayError("not_ready", f"index generation {name} is not in the store")
            root = self._key(name) + "/"
            # Every key is checked before the first byte is written.
            targets = [(info, staged_path(staging, root, info.path)) for info in files]
            for info, target in targets:
                relative = target.relative_to(staging).as_posix()
                if relative == PUBLISHED:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                same = reuse / relative if reuse is not None else None
                name = Path(relative).name
                immutable = _SEGMENT_FILE.match(name) or ROWS_FILE.match(name)
                if immutable and same and same.is_file() and same.stat().st_size == info.size:
                    os.link(same, target)
                    continue
                with fs.open_input_stream(info.path) as source, target.open("wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
            (staging / PUBLISHED).write_text("fetched\n")  # only names the catalog committed
            _into_place(staging, local)
        except OSError as exc:
            raise _store_error(exc) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def answers(self) -> bool:
        """Whether the store answers now: one listing of the top of the lexical tree, not
        of every file under it (as `published` makes), for the looks that ask only this."""
        try:
            self._fs().get_file_info(
                pafs.FileSelector(self._key("lexical"), allow_not_found=True, recursive=False)
            )
        except OSError:
            return False
        return True

    def published(self, parent: str) -> list[str]:
        """Names of the directories directly under `parent/` that hold files (a store
        may keep a directory entry once its files are gone)."""
        root = self._key(parent) + "/"
        try:
            listing = self._fs().get_file_info(
                pafs.FileSelector(self._key(parent), allow_not_found=True, recursive=True)
            )
        except OSError as exc:
            raise _store_error(exc) from None
        names = {
            i.path[len(root) :].split("/", 1)[0]
            for i in listing
            if i.type == pafs.FileType.File and "/" in i.path[len(root) :]
        }
        return sorted(names)

    def usage(self, name: str) -> tuple[int, int]:
        """(objects, bytes) under `name/`: what removing it frees."""
        selector = pafs.FileSelector(self._key(name), allow_not_found=True, recursive=True)
        try:
            files = [i for i in self._fs().get_file_info(selector) if i.type == pafs.FileType.File]
        except OSError as exc:
            raise _store_error(exc) from None
        return len(files), sum(i.size or 0 for i in files)

    def remove(self, name: str) -> None:
        """Delete everything under `name/` (nothing to do when nothing is there)."""
        fs = self._fs()
        try:
            selector = pafs.FileSelector(self._key(name), allow_not_found=True, recursive=True)
            if any(i.type == pafs.FileType.File for i in fs.get_file_info(selector)):
                fs.delete_dir(self._key(name))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _store_error(exc) from None


def abandoned_fetch(entry: Path) -> bool:
    """Whether `entry` is the staging directory of a fetch whose process is gone (on this
    host: a generation's local copies are the host's own)."""
    if not entry.name.startswith(FETCHING):
        return False
    pid, dash, _ = entry.name[len(FETCHING) :].partition("-")
    if not (dash and pid.isdigit()):  # an older release's name: by its age
        try:
            return time.time() - entry.stat().st_mtime > UNNAMED_FETCH_S
        except FileNotFoundError:
            return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # running, as another user
    return False


def staged_path(staging: Path, root: str, key: str) -> Path:
    """Where the object `key` (under `root`, which ends with `/`) goes in `staging`; a
    GatewayError `index_invalid` when it would go anywhere else."""
    relative = key[len(root) :] if key.startswith(root) else ""
    segments = relative.split("/")
    unsafe = (
        not relative
        or "\\" in relative
        or "\x00" in relative
        or any(segment in ("", ".", "..") for segment in segments)
    )
    target = staging.joinpath(*segments)
    if unsafe or not target.resolve().is_relative_to(staging.resolve()):
        # The key is the bucket writer's text: its length and form only, never itself.
        raise GatewayError(
            "index_invalid",
            f"an object under {root!r} has a key that leaves its generation's directory "
            f"({len(key)} characters; absolute, '.', '..', empty segments, backslashes and "
            "NUL are refused); nothing of it was copied",
        )
    return target


# What an S3 store answers until its configuration is fixed, by the error code of its reply:
# pyarrow's message names it as "AWS Error NO_SUCH_BUCKET during ...", LanceDB's quotes the
# reply's "<Code>NoSuchBucket</Code>" (gateway/storage/vectors.py).
STORE_REFUSES = {
    "InvalidAccessKeyId": "does not know the configured access key (AWS_ACCESS_KEY_ID)",
    "SignatureDoesNotMatch": "refuses the configured secret key (AWS_SECRET_ACCESS_KEY)",
    "AccessDenied": "denies the configured key access to the bucket of GATEWAY_INDEX_URI",
    "NoSuchBucket": "has no bucket of the name GATEWAY_INDEX_URI gives",
}
_PYARROW_ERROR_CODE = re.compile(r"AWS Error ([A-Z_]+) during")


def store_refuses(code: str) -> GatewayError:
    """A store that answers but refuses the configured bucket or key (`code`, a key of
    STORE_REFUSES): still `not_ready`, so that the operator's fix (or an access policy that
    takes a moment to apply) is waited for and no job is failed for it, but naming the
    setting to fix instead of "cannot be reached"."""
    return GatewayError(
        "not_ready",
        f"the index store {STORE_REFUSES[code]} ({code}); fix the setting (a server takes "
        "new credentials at its restart)",
    )


def store_unreachable(exc: Exception) -> GatewayError:
    # The type only: a storage error message can carry the endpoint and the key.
    return GatewayError(
        "not_ready", f"the index store cannot be reached ({type(exc).__name__}); retry shortly"
    )


def _store_error(exc: OSError) -> GatewayError:
    """pyarrow's error: the store refusing the configuration, or away. Only the S3 error
    code is kept of its message, which names the bucket, the key and the endpoint."""
    if found := _PYARROW_ERROR_CODE.search(str(exc)):
        code = found.group(1).title().replace("_", "")  # NO_SUCH_BUCKET: NoSuchBucket
        if code in STORE_REFUSES:
            return store_refuses(code)
    return store_unreachable(exc)


def _into_place(staging: Path, local: Path) -> None:
    """`staging` renamed to `local`, unless another process of the host put its own copy
    there first: that one is whole (renamed into place too), and it may already be
    searched, so it is kept; deleting it to put this one in its place would make its
    partitions vanish under those searches."""
    try:
        staging.rename(local)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not local.is_dir():
            raise
