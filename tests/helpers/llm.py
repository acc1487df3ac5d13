"""A fake OpenAI-compatible LLM endpoint, for the app's `llm_transport`: it speaks the chat
completions streaming protocol and records every request it received. `llm_apps` serves
apps that answer through one."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.settings import Settings
from tests.helpers.identity import make_settings

FENCE = re.compile(r'<(evidence-[0-9a-f]+) n="(\d+)">\n(.*?)\n</\1>\n', re.S)


@dataclass
class FakeLlm:
    """An OpenAI-compatible endpoint: `reply(prompt_blocks) -> text`, or an HTTP status."""

    reply: Callable[[dict[int, str]], str] = lambda blocks: "I don't know."
    status: int = 200
    delay_s: float = 0.0
    # How the reply is cut into stream chunks: by words unless given.
    split: Callable[[str], list[str]] | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    raw: bytes | None = None  # sent as the event stream instead (a broken provider's)
    # How the stream ends: the last chunk's finish_reason (None: no such chunk), then
    # `data: [DONE]` unless `done` is False (a proxy closing after the upstream died).
    finish: str | None = "stop"
    done: bool = True

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.status != 200:
            return httpx2.Response(self.status, json={"error": {"message": "overloaded"}})
        if self.raw is not None:
            return httpx2.Response(
                200, content=self.raw, headers={"content-type": "text/event-stream"}
            )
        text = self.reply(blocks_of(body))
        words = self.split(text) if self.split else re.findall(r"\S+\s*", text)
        events = [_chunk(body["model"], {"role": "assistant", "content": ""})]
        events += [_chunk(body["model"], {"content": w}) for w in words]
        if self.finish is not None:
            events.append(_chunk(body["model"], {}, finish=self.finish))
        stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
        stream += "data: [DONE]\n\n" if self.done else ""
        return httpx2.Response(
            200, content=stream.encode(), headers={"content-type": "text/event-stream"}
        )


LlmApp = Callable[..., TestClient]  # (fake, policy dir or None) -> a started client


def llm_app_of(
    fake: FakeLlm, data_dir: Path, jwks_file: Path, embedder: Embedder, policy: Path | None
) -> FastAPI:
    """An app on `data_dir` whose LLM (model `model-a`) is `fake`, at the HTTP transport."""
    base = make_settings(data_dir, jwks_file, policy)
    settings = Settings(
        **{**base.model_dump(), "llm_base_url": "http://llm.test/v1", "llm_model": "model-a"}
    )
    return create_app(settings, embedder=embedder, llm_transport=httpx2.MockTransport(fake))


@contextmanager
def llm_apps(data_dir: Path, jwks_file: Path, embedder: Embedder) -> Iterator[LlmApp]:
    """Starts an app on `data_dir` whose LLM (model `model-a`) is the `FakeLlm` it is
    given, faked at the HTTP transport; every app started is stopped on leaving."""
    clients: list[TestClient] = []

    def start(fake: FakeLlm, policy: Path | None = None) -> TestClient:
        client = TestClient(llm_app_of(fake, data_dir, jwks_file, embedder, policy))
        client.__enter__()
        clients.append(client)
        return client

    try:
        yield start
    finally:
        for client in clients:
            client.__exit__(None, None, None)


def _chunk(model: str, delta: dict[str, str], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def blocks_of(body: dict[str, Any]) -> dict[int, str]:
    """Evidence number -> fenced text, as the endpoint received it."""
    user = body["messages"][-1]["content"]
    return {int(m.group(2)): m.group(3) for m in FENCE.finditer(user)}


def cite_block_with(code: str, sentence: str) -> Callable[[dict[int, str]], str]:
    def reply(blocks: dict[int, str]) -> str:
        n = next(n for n, text in blocks.items() if code in text)
        return f"{sentence} [{n}]"

    return reply
