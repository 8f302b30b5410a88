"""Importers: the telemetry operators already have, read into the same schema as live data (``hermeneut import``).

One importer per format, each a plugin of kind ``importer`` in :mod:`pipeline.registry` (adding one is a line
there): ``prometheus`` (dcgm-exporter series in a Prometheus server), ``dcgm-exporter`` (saved scrapes, one file
each), ``nvidia-smi-csv`` (``--query-gpu ... --format=csv`` logs), ``nvidia-smi-xml`` (directories of ``nvidia-smi
-q -x`` captures, replayed through the real NVML collector) and ``table`` (any CSV or parquet trace with a small TOML
mapping). Each yields :class:`~producers.importers.rows.Block` s: readings column-wise, in our units, with the rows
it could not read and why. :mod:`producers.importers.driver` turns blocks into the raw topic's node messages (with
the per-series sampling interval it detects, and the workload context ahead of the rows it covers), marked as
backfill, and dead-letters what no one can store.
"""
