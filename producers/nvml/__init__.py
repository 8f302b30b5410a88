"""NVML node collection: ``collector`` (GPU samples), ``events`` (NVML events), ``topology``, ``reasons``
(throttle-reason names) and ``source`` (all of them as one agent source)."""

from producers.nvml.collector import NvmlCollector
from producers.nvml.reasons import decode_throttle_reasons
from producers.nvml.source import NvmlSource

__all__ = ["NvmlCollector", "NvmlSource", "decode_throttle_reasons"]
