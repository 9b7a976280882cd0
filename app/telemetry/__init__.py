"""Telemetry on the ground floor: structured logs and optional OpenTelemetry traces, importable from anywhere."""
