"""Every response names the policy version that decided it, in `Gateway-Policy-Version`.

Bodies of /search and /answer carry it too; the header covers every other route, errors
included. A request whose caller was resolved reports the policy that resolved it; any
other request (public routes, refused tokens) reports the policy serving at the time.
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

POLICY_HEADER = "Gateway-Policy-Version"


class PolicyVersionHeader:
    """Pure ASGI, so it never buffers a response (streaming answers stay streamed)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_version(message: Message) -> None:
            if message["type"] == "http.response.start":
                version = _version(scope)
                if version:
                    MutableHeaders(scope=message).append(POLICY_HEADER, version)
            await send(message)

        await self.app(scope, receive, send_with_version)


def _version(scope: Scope) -> str | None:
    loaded: Any = scope.get("state", {}).get("policy")
    if loaded is None:
        gateway = getattr(scope["app"].state, "gateway", None)
        loaded = gateway.policy if gateway is not None else None
    return getattr(loaded, "version", None)
