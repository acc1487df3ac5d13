"""Release gates: YAML cases of a caller, a query, and what must and must not come back.

```yaml
cases:
  - name: merchant rule stays with merchant risk
    caller: {sub: ana, tenant: northwind, region: EU, groups: [staff]}
    query: What does rule MRC-7781 say?
    must_not: [merchant-chargeback-limits-eu]     # document IDs, or chunk IDs (with "@")
  - name: returns policy is found
    caller: {sub: ana, tenant: northwind, region: EU, groups: [staff]}
    query: How many days do customers have to return an item?
    top_k: 5
    must: [returns-eu@2:0]
```

Each case runs through the same restricted search as `POST /search`, with the caller's
claims resolved by the serving policy.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.evaluation.beir import utf8
from gateway.policy.model import Policy
from gateway.policy.resolve import resolve_caller
from gateway.retrieval.results import SearchHit
from gateway.retrieval.scope import RequestScope
from gateway.retrieval.search import HybridSearcher
from gateway.storage.layout import ServedIndex
from gateway.telemetry.stages import StageClock


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    caller: dict[str, Any] = Field(description="Token claims: sub, tenant, region, groups")
    query: str = Field(min_length=1, max_length=2000)
    top_k: int = Field(default=10, ge=1, le=100)
    group_by: Literal["chunk", "document"] = "chunk"
    must: tuple[str, ...] = ()
    must_not: tuple[str, ...] = ()


class CaseFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cases: list[Case] = Field(min_length=1)


@dataclass(frozen=True)
class CaseResult:
    name: str
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    error: str = ""

    @property
    def passed(self) -> bool:
        return not (self.missing or self.unexpected or self.error)

    def line(self) -> str:
        if self.passed:
            return f"PASS  {self.name}"
        why = self.error or "; ".join(
            part
            for part in (
                f"missing {', '.join(self.missing)}" if self.missing else "",
                f"must not appear but did: {', '.join(self.unexpected)}" if self.unexpected else "",
            )
            if part
        )
        return f"FAIL  {self.name}: {why}"


def load_cases(path: Path) -> list[Case]:
    try:
        data = yaml.safe_load(utf8(path, path.read_bytes()))
        return CaseFile.model_validate({"cases": data} if isinstance(data, list) else data).cases
    except (yaml.YAMLError, ValidationError, OSError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def _ids(hits: list[SearchHit]) -> set[str]:
    return {h.chunk_id for h in hits} | {h.doc_id for h in hits}


def run_cases(
    cases: list[Case], index: ServedIndex, searcher: HybridSearcher, policy: Policy
) -> list[CaseResult]:
    async def one(case: Case) -> CaseResult:
        try:
            caller = resolve_caller(case.caller, policy)
        except Exception as exc:  # a case with unusable claims fails; the others still run
            return CaseResult(case.name, (), (), f"caller: {exc}")
        scope = RequestScope(index, policy, caller, case.query, case.top_k, StageClock())
        outcome = await searcher.search(scope, case.group_by)
        found = _ids(outcome.hits)
        return CaseResult(
            case.name,
            tuple(x for x in case.must if x not in found),
            tuple(x for x in case.must_not if x in found),
        )

    async def all_cases() -> list[CaseResult]:
        return [await one(case) for case in cases]

    return asyncio.run(all_cases())
