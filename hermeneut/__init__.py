"""The face: what wires the stages together for a person. ``cli/`` (the ``hermeneut`` command), ``web/`` (the HTTP
API and dashboard), ``jobs/`` (what drives several stages: the main job, imports, training, the evaluations),
``views/`` (what the CLI and the API both show: health, reliability, right-sizing) and ``stages`` (a stage as a
child process, started with this package's command line).

The one package allowed to import every stage; nothing imports it but the entry point (``hermeneut`` =
``hermeneut.cli:main``). See docs/architecture.md.
"""
