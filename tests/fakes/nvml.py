"""The real ``nvidia-smi -q -x`` captures of tests/testdata/nvidia-smi-xml, by name, for the NVML replay
(:mod:`producers.nvml.replay`) that the collector's tests run on."""

from __future__ import annotations

from pathlib import Path

from producers.nvml.capture import CapturedGpu, parse_capture

CAPTURES = Path(__file__).resolve().parent.parent / "testdata" / "nvidia-smi-xml"


def load_capture(name: str) -> list[CapturedGpu]:
    """Every GPU of one capture file (e.g. ``"rtx-3090-v12.xml"``)."""
    return parse_capture(CAPTURES / name)


def capture_names() -> list[str]:
    return sorted(p.name for p in CAPTURES.glob("*.xml"))
