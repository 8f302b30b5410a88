"""Domain detectors: GPU faults recognised by their physical signatures, each with evidence and an action.

The ``Detectors`` stage (processors.detectors.stage; last in the interpretation chain) emits
:class:`pipeline.events.Finding` s named after the fault classes (``thermal-throttling``, ``power-capping``,
``nvlink-down``, ``pcie-link-degraded``, ``memory-leak``, ``straggler``, ``xid-storm``, ``ecc-uncorrectable``,
``fallen-off-bus``) plus ``xid`` (single XIDs below storm level), ``row-remap`` (a remap/retirement waiting for a
reset) and ``idle-capacity`` (allocated but unused). A finding is sent when its condition starts, again every
``repeat_s`` while it holds, and once with ``active=False`` when it clears; the summary of every active finding is
appended to the ``explanation`` of the GPU's rows. A power cap that lowers several GPUs of a node at once (a failed
power supply, a rack's budget) is one *node-level* finding (``gpu_uuid`` None) naming the GPUs; each of their rows
carries its summary.

Everything runs on *data time* (the samples' ``ts_ns``), never the wall clock, so a replay or a fast-forwarded
history gives the findings a live stream would have given, at the same timestamps. How each detector tells a fault
from healthy behaviour that looks alike (idle PCIe downshift, checkpoint dips, KV-cache growth, an operator's power
cap) is in docs/detectors.md.

One module per detector family, its rule next to its wording; the wording of a finding sees one GPU
(:class:`processors.detectors.gpus.GpuView`), never the stage:

- ``thermal`` (thermal throttling), ``power`` (power capping, per GPU and per node), ``links`` (NVLink down, PCIe
  degraded), ``memory`` (memory leaks), ``stragglers`` (peer comparison within a job), ``hard_errors`` (the XID
  catalogue; XIDs and storms, uncorrectable ECC, row remaps, fallen off the bus), ``idle`` (idle capacity);
- what they share: ``names`` (the findings' names), ``gpus`` (each GPU's latest reading, and the view of it),
  ``jobs`` (job boundaries from context and telemetry), ``debounce`` (the scored level conditions of thermal,
  links and idle), ``findings`` (episodes to findings, worded by their family), ``columns`` (numpy helpers);
- ``stage``: the ``Detectors`` stage composing them. Per-GPU state lives in arrays of the processor's one
  slot table (processors.state), episodes in processors.episodes.
"""
