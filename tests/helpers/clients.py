"""Clients no one here wrote, pointed at the app: OpenAI's SDK over a TestClient.

The SDK speaks httpx2; the transport below hands each request to the TestClient (the real
app, its lifespan run) and its response back, whole: a streamed body arrives at once, and
the SDK parses it as it would off the network.
"""

from __future__ import annotations

import httpx2
from fastapi.testclient import TestClient
from openai import OpenAI

DROPPED_REQUEST = {"host", "content-length", "transfer-encoding"}
DROPPED_RESPONSE = {"content-length", "content-encoding", "transfer-encoding"}


def through(client: TestClient) -> httpx2.MockTransport:
    def handle(request: httpx2.Request) -> httpx2.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED_REQUEST}
        response = client.request(
            request.method, request.url.raw_path.decode(), headers=headers, content=request.read()
        )
        kept = [(k, v) for k, v in response.headers.multi_items() if k not in DROPPED_RESPONSE]
        return httpx2.Response(response.status_code, headers=kept, content=response.content)

    return httpx2.MockTransport(handle)


def openai_sdk(client: TestClient, token: str) -> OpenAI:
    """OpenAI's client, no retries (a 429 or 503 must reach the test, not be tried again)."""
    http = httpx2.Client(transport=through(client))
    return OpenAI(base_url="http://testserver/v1", api_key=token, max_retries=0, http_client=http)
