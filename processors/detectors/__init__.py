"""Domain detectors: GPU faults recognised by their physical signatures (see processors.detectors.stage)."""

from processors.detectors.stage import Detectors, fast_leak

__all__ = ["Detectors", "fast_leak"]
