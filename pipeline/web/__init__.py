"""The HTTP surface: one aiohttp application (``app.create_app``) with a route module per area."""
