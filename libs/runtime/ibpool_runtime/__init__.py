"""ibpool_runtime: what every ibpool service stands on (bus, store, telemetry, HTTP, config, lifecycle)."""
