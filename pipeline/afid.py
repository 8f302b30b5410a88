"""AMD RAS events: what an AFID reported with a CPER severity means, how bad it is, and what to do.

An AMD Instinct GPU reports a hardware error as a CPER record (UEFI's Common Platform Error Record); the driver
and amd-smi read the record's AMD Field IDs (AFIDs), numbers that name a known condition, and the
device-metrics-exporter prints the AFIDs of the last RAS event as ``gpu_afid_errors{afid_index, severity}`` (the
value is the AFID). Each becomes one :class:`~pipeline.events.GpuEvent` of kind ``afid`` with the AFID as its code
and :func:`describe`'s words as its detail.

Sources:

- the severities: CPER's error severity (UEFI 2.10, appendix N: 0 recoverable, 1 fatal, 2 corrected,
  3 informational) as amd-smi's RAS page names them ("0 - Recoverable (also called non-fatal uncorrected)",
  ROCm/rocm-systems ``projects/amdsmi/docs/conceptual/ras.md``) and the exporter's ``severity`` label values
  (``fatal``, ``non_fatal_uncorrected``, ``non_fatal_corrected``: ROCm/device-metrics-exporter
  ``docs/configuration/metricslist.md``, "AFID Error metrics");
- the AFIDs themselves: AMD's "AFID Event List" (docs.amd.com, AMD_Field_ID_70122_v1.0) gives each a category,
  type, severity and service action. That list could not be read from here, so no AFID number is catalogued yet
  (:data:`AFIDS` is empty, on purpose: no meaning is guessed); every AFID is judged by its CPER severity and its
  detail points to the list. Add an entry only with its source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pipeline.events import Severity

#: where an AFID's service action is looked up
AFID_LIST: Final = "https://docs.amd.com/r/en-US/AMD_Field_ID_70122_v1.0/AFID-Event-List"


@dataclass(frozen=True, slots=True)
class CperSeverity:
    """One CPER error severity as the exporter labels it, and how hermeneut judges it."""

    label: str
    #: CPER's number for it (UEFI 2.10, N.2.1 "Error Severity")
    cper: int
    meaning: str
    severity: Severity
    action: str


SEVERITIES: Final[dict[str, CperSeverity]] = {
    s.label: s
    for s in (
        CperSeverity(
            "fatal",
            1,
            "fatal hardware error",
            Severity.CRITICAL,
            "drain the GPU and reset it; follow the AFID's service action",
        ),
        CperSeverity(
            "non_fatal_uncorrected",
            0,
            "uncorrected error, contained (recoverable)",
            Severity.CRITICAL,
            "restart the affected application; reset the GPU at the next drain",
        ),
        CperSeverity("non_fatal_corrected", 2, "corrected error", Severity.WARNING, "watch the GPU; act if it recurs"),
    )
}


#: CPER's number for an uncorrected error that was contained (the application's to restart, the GPU works)
CONTAINED: Final = SEVERITIES["non_fatal_uncorrected"].cper


@dataclass(frozen=True, slots=True)
class Afid:
    """One AFID of AMD's list (none yet: see the module docstring)."""

    code: int
    meaning: str
    action: str
    source: str


AFIDS: Final[dict[int, Afid]] = {}


def judge(label: str) -> CperSeverity:
    """The severity the exporter's label names; a label AMD adds later is judged a warning, never dropped."""
    known = SEVERITIES.get(label)
    if known is not None:
        return known
    return CperSeverity(label, -1, f"RAS event of severity {label!r}", Severity.WARNING, "look the AFID up")


#: how severe each label is, the worst first (a label AMD adds later ranks with the corrected)
_RANK: Final = {"fatal": 0, "non_fatal_uncorrected": 1}


def worse(a: str, b: str) -> str:
    """The more severe of two labels (the first where they rank alike)."""
    return b if _RANK.get(b, 2) < _RANK.get(a, 2) else a


def label_of(detail: str) -> str:
    """The severity label of an ``afid`` event's detail (:func:`describe` writes it first)."""
    return detail.split(":", 1)[0].strip()


def describe(code: int, label: str) -> str:
    """The event's detail: severity, meaning and what to do, e.g. ``fatal hardware error (AFID 30): drain the GPU
    and reset it; ...; see <AFID list>``."""
    severity = judge(label)
    afid = AFIDS.get(code)
    meaning = afid.meaning if afid else severity.meaning
    action = afid.action if afid else severity.action
    return f"{label}: {meaning} (AFID {code}): {action}; see {AFID_LIST}"
