"""Sinks: write interpreted events to InfluxDB, committing offsets only after acknowledged writes."""
