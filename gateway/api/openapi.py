"""The OpenAPI document of the app as YAML, the form checked in as `openapi.yaml`.

Regenerate with `make openapi` (`python -m gateway.api.openapi > openapi.yaml`); a test
fails when the checked-in file and the app disagree.
"""

from __future__ import annotations

import sys

import yaml

from gateway.api.app import create_app
from gateway.settings import Settings


def render() -> str:
    """Building the schema needs no model, index or issuer: the lifespan never runs."""
    schema = create_app(Settings()).openapi()
    return yaml.safe_dump(schema, sort_keys=False, allow_unicode=True, width=100)


if __name__ == "__main__":
    sys.stdout.write(render())
