"""The OTLP sink plugin (``otlp``): telemetry, findings and health states to an OpenTelemetry Collector."""
