"""The Kubernetes hand-off: each GPU's health (the health topic) as a node condition and a DRA DeviceTaintRule
(``hermeneut kubernetes sync``): :mod:`~sinks.kubernetes.plan` decides, :mod:`~sinks.kubernetes.api` talks to the
API server, :mod:`~sinks.kubernetes.sync` runs the rounds."""
