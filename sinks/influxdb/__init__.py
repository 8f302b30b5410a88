"""The InfluxDB 2.x sink: ``lines`` (interpreted events, findings, baselines, feedback as line protocol; pure),
``write`` (the only I/O: lines to InfluxDB, errors sorted into transient, backpressure and permanent) and ``sink``
(the ``influxdb`` plugin the generic runner in :mod:`sinks.runner` drives). Reads go through :mod:`sinks.query`.
"""
