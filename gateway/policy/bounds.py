"""How much an edited policy `POST /admin/policy/preview` takes: any tenant admin may send
one, and its cost is the server's CPU and memory, so the serving policy's `preview:` bounds
the files before they are parsed and the policy before it is diffed. Each bound exceeded
is named (`preview.<bound>`) in a 422 `preview_too_large`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import GatewayError
from gateway.policy.numbers import Number, Whole

if TYPE_CHECKING:
    from gateway.policy.model import Policy


class Preview(BaseModel):
    """Bounds of `POST /admin/policy/preview`, which any tenant admin may call: the serving
    policy's bounds apply to the edited files (docs/policy.md, "preview")."""

    # Numbers as in every policy section (gateway/policy/model.py, _Frozen): strict, finite.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_files: Whole = Field(default=16, ge=1, le=1000, description="Files in one preview")
    max_bytes: Whole = Field(
        default=512 * 1024,
        ge=1024,
        le=4 * 1024 * 1024,
        description="The files' text together, in UTF-8 bytes (the body limit is 4 MiB)",
    )
    max_grants: Whole = Field(default=5000, ge=1, le=1_000_000, description="Entries of grants")
    max_groups: Whole = Field(
        default=5000,
        ge=1,
        le=1_000_000,
        description="Distinct groups that nested_groups and grants name",
    )
    max_rules: Whole = Field(
        default=20_000,
        ge=1,
        le=10_000_000,
        description="Principals the grants give, parents of nested groups and regions "
        "also_reads names, together",
    )
    max_held: Whole = Field(
        default=500_000,
        ge=1,
        le=100_000_000,
        description="Principals the diff's callers hold, summed over every kind of caller "
        "(each group, each user an ACL names) under both policies",
    )
    max_nesting_depth: Whole = Field(
        default=16, ge=1, le=1000, description="Groups in the longest chain of nested_groups"
    )
    timeout_s: Number = Field(
        default=20.0,
        gt=0,
        le=600,
        description="Past it the preview stops and answers 503 preview_timeout",
    )
    per_tenant: Whole = Field(
        default=1,
        ge=1,
        le=100,
        description="Previews one tenant may run at once, per process; beyond it 429 "
        "preview_busy with Retry-After",
    )
    max_concurrent: Whole = Field(
        default=2,
        ge=1,
        le=64,
        description="Previews of all tenants at once, per process, each in a thread of its "
        "own pool (never the one the routes use); beyond it 429 preview_busy",
    )


def check_files(files: Mapping[str, str], bounds: Preview) -> None:
    """Before anything is parsed: how many files, and how much text."""
    size = sum(len(text.encode("utf-8", "surrogatepass")) for text in files.values())
    _refuse(
        [
            _over("files", len(files), "files", "max_files", bounds),
            _over("files", size, "bytes of text", "max_bytes", bounds),
        ]
    )


def check_policy(policy: Policy, bounds: Preview) -> None:
    """Before the diff: what a diff's cost grows with (callers are groups, rules are what
    resolving one of them walks)."""
    nested = policy.nested_groups
    groups = {g for child, parents in nested.items() for g in (child, *parents)}
    groups.update(grant.group for grant in policy.grants)
    rules = (
        sum(len(grant.grants) for grant in policy.grants)
        + sum(len(parents) for parents in nested.values())
        # Each region it names, the keys too: a key with no list is still a region every
        # change lists (35,000 of them made a 7 MB answer while counting as no rule).
        + sum(1 + len(regions) for regions in policy.regions.also_reads.values())
    )
    _refuse(
        [
            _over("grants", len(policy.grants), "entries", "max_grants", bounds),
            _over("nested_groups and grants", len(groups), "groups", "max_groups", bounds),
            _over("grants, nested_groups, regions", rules, "rules", "max_rules", bounds),
            _over(
                "nested_groups", longest_chain(nested), "groups deep", "max_nesting_depth", bounds
            ),
        ]
    )


def held_over(count: int, bounds: Preview) -> None:
    """During the diff: the principals its callers hold so far, against `max_held`. The
    rules bound what a policy writes, not what each group holds through them: 5,000 groups
    nested in one granted 15,000 principals held 75 million, gigabytes, within every other
    bound."""
    _refuse([_over("the callers", count, "principals held", "max_held", bounds)])


def longest_chain(nested: Mapping[str, tuple[str, ...]]) -> int:
    """Groups in the longest chain child -> parent -> ... (the policy refuses cycles)."""
    depth: dict[str, int] = {}
    for root in nested:
        stack = [(root, False)]
        while stack:
            group, parents_done = stack.pop()
            if group in depth:
                continue
            parents = nested.get(group, ())
            if parents_done:
                depth[group] = 1 + max((depth.get(p, 0) for p in parents), default=0)
            else:
                stack.append((group, True))
                stack.extend((p, False) for p in parents if p not in depth)
    return max(depth.values(), default=0)


def _over(where: str, count: int, noun: str, bound: str, bounds: Preview) -> str | None:
    limit: int = getattr(bounds, bound)
    if count <= limit:
        return None
    return f"{where}: {count} {noun}, over the bound of {limit} (preview.{bound})"


def _refuse(found: list[str | None]) -> None:
    problems = [p for p in found if p is not None]
    if problems:
        raise GatewayError(
            "preview_too_large",
            "the edited policy is over the preview's bounds (the serving policy's "
            "`preview:`): " + "; ".join(problems),
            extra={"problems": problems},
        )
