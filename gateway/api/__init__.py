"""The HTTP API: app factory, routes, problem+json errors."""
