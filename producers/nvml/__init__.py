"""NVML node collection: ``collector`` (GPU samples), ``events`` (NVML events), ``topology``, ``source`` (all of
them as one agent source), ``capture`` (nvidia-smi -q -x captures parsed into NVML's answers) and ``replay`` (an
NVML that replays captures)."""

from producers.nvml.collector import NvmlCollector
from producers.nvml.source import NvmlSource

__all__ = ["NvmlCollector", "NvmlSource"]
