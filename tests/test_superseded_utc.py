"""Superseded-version retention counts days in UTC, like every other decision on dates,
whatever zone the writer's host is set to."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.embedding import Embedder
from tests.helpers.callers import ALICE, ROOT
from tests.helpers.documents import day, doc
from tests.helpers.identity import TokenFactory, bearer
from tests.helpers.push_app import push_app

SUBJECT = {"tenant": "acme", "region": "EU"}  # the claims a token of acme, EU holds


@contextmanager
def host_zone_on_another_day() -> Iterator[None]:
    """The process's local zone set to one whose date is not today's in UTC: 14 hours
    ahead in UTC's afternoon, 12 hours behind in its morning."""
    zone = "Etc/GMT-14" if dt.datetime.now(dt.UTC).hour >= 12 else "Etc/GMT+12"
    old = os.environ.get("TZ")
    os.environ["TZ"] = zone
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


def test_superseded_retention_counts_days_in_utc_whatever_the_hosts_zone(
    tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
) -> None:
    with push_app(tmp_path, embedder, jwks_file, retention={"superseded_days": 0}) as app:
        client, writer, key = app
        # "ended" v1 closed yesterday (UTC): past a retention of 0 days. "in-force" v1
        # closes today (UTC): its successor starts tomorrow, so it is served until then.
        for doc_id, successor_from in (("ended", day(0)), ("in-force", day(1))):
            for version, start in (("1", "2020-01-01"), ("2", successor_from)):
                pushed = doc(doc_id, version=version, effective_from=start)
                r = client.post(
                    "/admin/documents", json={"documents": [pushed]}, headers=bearer(key)
                )
                assert r.status_code == 202, r.text
                assert writer.run_once() == 1

        with host_zone_on_another_day():
            assert dt.date.today() != dt.datetime.now(dt.UTC).date()  # the premise
            writer.erase_due()

        served = client.get("/documents/in-force", headers=bearer(make_token(**ALICE)))
        assert served.status_code == 200, served.text
        assert served.json()["version"] == "1"
        explained = client.post(
            "/admin/explain",
            json={"subject": {**SUBJECT, **ALICE}, "doc_id": "ended"},
            headers=bearer(make_token(**ROOT)),
        )
        assert explained.status_code == 200, explained.text
        assert [v["version"] for v in explained.json()["versions"]] == ["2"]
