"""ID-only tracing: one OpenTelemetry span per stage."""
