"""The HTTP face of hermeneut: one aiohttp application (:func:`hermeneut.web.app.create_app`) with a route module
per area (``query_api``: trends, top-N, comparisons, anomaly history; ``alerts_api``: subscriptions, silences,
alerts, history). ``hermeneut web`` serves it."""
