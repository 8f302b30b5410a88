"""The XID catalogue: what an NVIDIA XID number means, how bad it is, what to do, and whose fault it is.

Source: NVIDIA, "Xid Errors" / "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html: mnemonic, description, immediate and
investigatory resolution buckets such as RESTART_APP, RESET_GPU, RESTART_BM, CONTACT_SUPPORT) and "Dynamic Page
Retirement" (https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html: XID 48/63/64). The
meanings are paraphrased; the severity and the action are our reading of NVIDIA's resolution buckets for an
operator of a shared fleet: an application error (``app``) is the tenant's to fix and is a warning; a hardware
error is critical when NVIDIA's bucket needs a GPU reset, a node reboot or support.

``memory`` marks the XIDs that report a memory (ECC) error: the ``ecc-uncorrectable`` detector owns those, so
they do not count towards an XID storm. An XID missing from the table is reported as "unknown XID" (warning,
"look it up in NVIDIA's Xid catalog"), never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pipeline.events import Severity


@dataclass(frozen=True, slots=True)
class Xid:
    """One catalogue entry."""

    code: int
    meaning: str
    severity: Severity
    action: str
    #: "app" (the application or its framework), "hardware", "driver" (firmware/driver state), "memory"
    cause: str
    memory: bool = False


_W, _C = Severity.WARNING, Severity.CRITICAL
_RESTART_APP = "restart the application; if it recurs on this GPU only, reset the GPU"
_RESET = "drain the GPU and reset it (nvidia-smi -r); if it recurs, report to NVIDIA support"
_REBOOT = "drain the node and reboot it; if it recurs, report to NVIDIA support"

CATALOGUE: Final[dict[int, Xid]] = {
    x.code: x
    for x in (
        Xid(8, "GPU stopped processing (channel idle timeout)", _W, _RESTART_APP, "app"),
        Xid(13, "graphics engine exception (illegal instruction or address in a kernel)", _W,
            "check the application (out-of-bounds access, bad kernel); restart it", "app"),
        Xid(31, "GPU memory page fault (illegal memory access by the application)", _W,
            "check the application for an illegal memory access; restart it", "app"),
        Xid(32, "invalid or corrupted push buffer stream", _W, _RESTART_APP, "driver"),
        Xid(38, "driver firmware error", _C, _RESET, "driver"),
        Xid(43, "GPU stopped processing (a channel was reset after an application error)", _W,
            "the GPU is usually fine: restart the application", "app"),
        Xid(45, "preemptive cleanup after a channel error or process kill", _W,
            "usually follows another XID or a killed process; look at the XID before it", "app"),
        Xid(46, "GPU stopped processing", _C, _RESET, "hardware"),
        Xid(48, "double-bit (uncorrectable) ECC error", _C,
            "drain the GPU and reset it to retire the page / remap the row; replace it if it recurs",
            "memory", memory=True),
        Xid(61, "internal micro-controller breakpoint/warning", _C, _RESET, "driver"),
        Xid(62, "internal micro-controller halt", _C, _RESET, "driver"),
        Xid(63, "ECC page retirement or row remapping recorded (reset to activate)", _W,
            "schedule a GPU reset at the next drain to activate the retirement/remap", "memory", memory=True),
        Xid(64, "ECC page retirement or row remapping failure", _C,
            "drain the GPU: the bad memory could not be retired; replace the GPU", "memory", memory=True),
        Xid(68, "video processor exception", _W, _RESTART_APP, "hardware"),
        Xid(69, "graphics engine class error", _W, _RESTART_APP, "app"),
        Xid(74, "NVLink error", _C, "drain the node; check NVLink/NVSwitch and reset the GPUs", "hardware"),
        Xid(79, "GPU has fallen off the bus", _C,
            "drain the node and reboot it; reseat the GPU / check its power and riser if it recurs", "hardware"),
        Xid(92, "high single-bit ECC error rate", _W,
            "watch the GPU's ECC counters; plan a replacement if the rate keeps rising", "memory", memory=True),
        Xid(94, "contained uncorrectable ECC error (the application using the memory was stopped)", _C,
            "restart the application; reset the GPU at the next drain to remap the row", "memory", memory=True),
        Xid(95, "uncontained uncorrectable ECC error", _C,
            "drain the GPU and reset it now: every application on it is affected", "memory", memory=True),
        Xid(109, "context switch timeout", _W, _RESTART_APP, "app"),
        Xid(119, "GSP RPC timeout", _C, _RESET, "driver"),
        Xid(120, "GSP error", _C, _RESET, "driver"),
        Xid(121, "C2C link corrected error", _W, "watch; report to NVIDIA support if it recurs", "hardware"),
        Xid(140, "ECC unrecovered error", _C, _RESET, "memory", memory=True),
        Xid(154, "GPU recovery action changed (reset or reboot required)", _C, _REBOOT, "driver"),
    )
}  # fmt: skip

#: XIDs that mean the GPU is gone from the bus (the fallen-off-bus detector owns them)
LOST: Final = frozenset({79})
#: XIDs that report an uncorrectable memory error (the ecc-uncorrectable detector owns them)
UNCORRECTABLE: Final = frozenset({48, 64, 94, 95, 140})


def describe(code: int) -> Xid:
    """The catalogue entry for ``code``; an unknown XID gets a generic entry instead of an error."""
    known = CATALOGUE.get(code)
    if known is not None:
        return known
    return Xid(code, f"unknown XID {code}", Severity.WARNING, "look it up in NVIDIA's Xid catalog", "unknown")
