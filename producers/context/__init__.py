"""Workload context: which job, user, application, model and framework runs on each GPU of a node.

Sources (each with its ``source`` name and a confidence in the application it reports):

- :mod:`~producers.context.static`: a TOML/CSV file, and ``hermeneut context set`` (``manual``) for one GPU;
- :mod:`~producers.context.slurm`: prolog/epilog files or ``squeue`` + ``scontrol -d show job``;
- :mod:`~producers.context.kubernetes`: the kubelet's pod-resources socket plus pod annotations and labels;
- :mod:`~producers.context.processes`: inferred from the command lines of the GPU's processes
  (rules in :mod:`~producers.context.inference`).

:mod:`~producers.context.merge` combines them (manual > static > scheduler > processes) and
:mod:`~producers.context.watch` publishes the changes as :class:`~pipeline.events.GpuContext` records to the
compacted context topic, keyed by GPU, with a tombstone when a workload ends.
"""
