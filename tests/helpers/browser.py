"""Headless Chromium (Debian's) driven by Playwright, for the tests of web pages."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

CHROMIUM = Path("/usr/bin/chromium")


def spki_hash(certificate: Path) -> str:
    """What Chromium's --ignore-certificate-errors-spki-list names: the base64 SHA-256 of a
    certificate's public key, so the browser trusts that one key and nothing wider."""
    cert = x509.load_pem_x509_certificate(certificate.read_bytes())
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


@contextmanager
def chromium(*args: str) -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", *args],
        )
        try:
            yield launched
        finally:
            launched.close()


@contextmanager
def console_page(browser: Any, base_url: str) -> Iterator[Any]:
    """A fresh browser context and page on `base_url`, closed afterwards."""
    context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(20_000)
    try:
        yield opened
    finally:
        context.close()
