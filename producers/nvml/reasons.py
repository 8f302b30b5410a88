"""Clock-event ("throttle") reasons: the bitmask stays a metric (``throttle_reasons_mask``); this decodes it.

Bit names are NVML's own (``nvmlClocksEventReason*``, formerly ``nvmlClocksThrottleReason*``), so a decoded list
reads like the NVML documentation: ``decode_throttle_reasons(0x24) == ["SwPowerCap", "SwThermalSlowdown"]``.
"""

from __future__ import annotations

from typing import Final

#: (bit, NVML name) in bit order; values from nvml.h (the same in pynvml)
THROTTLE_REASONS: Final[tuple[tuple[int, str], ...]] = (
    (0x0001, "GpuIdle"),
    (0x0002, "ApplicationsClocksSetting"),
    (0x0004, "SwPowerCap"),
    (0x0008, "HwSlowdown"),
    (0x0010, "SyncBoost"),
    (0x0020, "SwThermalSlowdown"),
    (0x0040, "HwThermalSlowdown"),
    (0x0080, "HwPowerBrakeSlowdown"),
    (0x0100, "DisplayClockSetting"),
    (0x0200, "BoardLimit"),
    (0x0400, "Reliability"),
)
_KNOWN: Final = sum(bit for bit, _ in THROTTLE_REASONS)


def decode_throttle_reasons(mask: int) -> list[str]:
    """The NVML names of the bits set in ``mask``; bits NVML has not named yet come out as ``Unknown(0x...)``."""
    if mask < 0:
        raise ValueError(f"a reasons mask is never negative, got {mask}")
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    rest = mask & ~_KNOWN
    if rest:
        names.append(f"Unknown({rest:#x})")
    return names
