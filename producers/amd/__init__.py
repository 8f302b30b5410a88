"""AMD Instinct GPUs as a source: AMD's device-metrics-exporter (``exporter.py``) and the AFID/CPER catalogue of
its RAS events (``afid.py``)."""
