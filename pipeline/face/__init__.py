"""The face: what wires the stages together for a person (the ``hermeneut`` CLI, the HTTP API and dashboard, and
the jobs that drive several stages: the main job, the evaluation, baseline training, right-sizing advice).

The one package allowed to import every stage; nothing imports it but the entry point (``hermeneut`` =
``pipeline.face.cli:main``). See docs/architecture.md.
"""
