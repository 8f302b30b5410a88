"""hermeneut: GPU-fleet telemetry interpreted in the context of the job on each GPU."""
