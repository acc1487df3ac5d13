"""Claims of the callers many test modules share (tenant acme, region EU unless they say)."""

from __future__ import annotations

from typing import Any

ALICE: dict[str, Any] = {"sub": "alice", "groups": ["staff"]}  # acme, EU


BOB: dict[str, Any] = {"sub": "bob", "groups": ["staff", "merchant-risk"]}  # acme, EU


CAROL: dict[str, Any] = {"sub": "carol", "region": "US", "groups": ["staff"]}


DAVE: dict[str, Any] = {"sub": "dave", "tenant": "globex", "groups": ["staff"]}


HIDDEN_FROM_ALICE = (
    "MRX-7781",
    "OLDV-1001",
    "LOY-0002",
    "BND-0303",
    "USR-5150",
    "GLX-9000",
    "QTE-4242",
)


# An admin of acme via a nested group, and an operator (the operators' tenant is acme).
ROOT: dict[str, Any] = {"sub": "root", "groups": ["ops", "staff"]}


EVE: dict[str, Any] = {"sub": "eve", "tenant": "globex", "groups": ["ops"]}  # globex admin
