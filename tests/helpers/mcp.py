"""Talking to /mcp: with the official `mcp` SDK client over real HTTP, or as raw JSON-RPC
(one POST, no handshake: the server is stateless) where a test needs the HTTP exchange."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import httpx2
from fastapi.testclient import TestClient
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

T = TypeVar("T")
# What an MCP client sends on a POST under the 2025-06-18 revision (legacy, stateless path).
HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2025-06-18",
}


def with_client(
    base: str, token: str | None, use: Callable[[Client], Awaitable[T]], mode: str = "auto"
) -> T:
    """`use(client)` with the SDK's client connected to `base`/mcp as the token's caller."""

    async def run() -> T:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            transport = streamable_http_client(f"{base}/mcp", http_client=http)
            async with Client(transport, mode=mode) as client:
                return await use(client)

    return anyio.run(run)


def rpc(method: str, params: dict[str, Any] | None = None, id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params or {}}


def post(client: TestClient, token: str | None, body: Any, **headers: str) -> Any:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return client.post("/mcp", json=body, headers={**HEADERS, **auth, **headers})


def call_tool(client: TestClient, token: str, name: str, **arguments: Any) -> dict[str, Any]:
    """The tool's result (`structuredContent`, `isError`, `content`), the call a success."""
    response = post(client, token, rpc("tools/call", {"name": name, "arguments": arguments}))
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["result"]
    return result
