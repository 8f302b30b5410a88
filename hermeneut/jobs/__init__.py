"""The jobs that drive several stages for a person: the main job (``hermeneut run``), history imports, baseline
training, and the evaluations (live, offline fleet-scale, faults laid over real traces) with their pure scoring."""
