"""The CPER severity catalogue: every severity the exporter labels is judged, an unknown one is not dropped."""

from __future__ import annotations

from pipeline.afid import AFID_LIST, AFIDS, SEVERITIES, describe, judge
from pipeline.events import Severity


def test_every_exporter_severity_label_is_a_cper_severity() -> None:
    # the exporter's labels (metricslist.md, "AFID Error metrics") and CPER's numbers (UEFI 2.10 N.2.1)
    assert {(s.label, s.cper) for s in SEVERITIES.values()} == {
        ("fatal", 1), ("non_fatal_uncorrected", 0), ("non_fatal_corrected", 2)
    }  # fmt: skip
    assert judge("fatal").severity is Severity.CRITICAL
    assert judge("non_fatal_corrected").severity is Severity.WARNING


def test_an_unknown_label_is_a_warning_and_every_detail_points_to_amds_list() -> None:
    assert judge("informational").severity is Severity.WARNING
    assert AFIDS == {}  # no AFID catalogued without its source (see the module docstring)
    detail = describe(30, "fatal")
    assert detail.startswith("fatal: fatal hardware error (AFID 30): drain the GPU") and detail.endswith(AFID_LIST)
