"""Watching a running program from outside: traces of its requests, model calls, cells and folds (OpenTelemetry, when enabled)."""
