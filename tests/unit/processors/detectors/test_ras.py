"""AMD RAS events judged (issue 41: "health events from CPER/AFID as typed events"): an ``afid`` event, as the AMD
sources write it (pipeline.afid.describe), is a ``ras-event`` finding whose severity, words and health follow its
CPER severity: fatal makes the GPU unhealthy until its own samples have been quiet for 10 minutes (silence is no
recovery), a contained error is the application's, a corrected one is watched; a worse event joins the open
episode and raises it. The AFID numbers are arbitrary here: none is catalogued (pipeline/afid.py says why)."""

from __future__ import annotations

import pytest

from pipeline.afid import describe
from pipeline.events import EventKind, Finding, GpuEvent
from pipeline.health.fold import FiringFinding, reason_of
from pipeline.health.states import Health, Remedy
from tests.unit.processors.detectors.driver import T0, S, run, starts


def afid(t: int, label: str, code: int = 30, gpu: int = 2) -> GpuEvent:
    return GpuEvent("c1", "node-1", f"GPU-{gpu}", gpu, T0 + t * S, EventKind.AFID, code, describe(code, label))


def health(f: Finding) -> tuple[Health, Remedy]:
    reason = reason_of(FiringFinding({"detector": f.detector, "severity": f.severity.value}, f.summary, 0, f.evidence))
    assert reason is not None
    return reason.state, reason.remedy


@pytest.mark.parametrize(
    ("label", "severity", "state", "remedy", "words"),
    [
        ("fatal", "critical", Health.UNHEALTHY, Remedy.RESET_GPU, "fatal hardware error"),
        ("non_fatal_uncorrected", "critical", Health.DEGRADED, Remedy.RESTART_JOB, "contained"),
        ("non_fatal_corrected", "warning", Health.DEGRADED, Remedy.NONE, "corrected error"),
        ("a_label_amd_adds_later", "warning", Health.DEGRADED, Remedy.NONE, "'a_label_amd_adds_later'"),
    ],
)
def test_a_ras_event_is_judged_by_its_cper_severity(
    label: str, severity: str, state: Health, remedy: Remedy, words: str
) -> None:
    _det, found, _ = run(120, events=lambda t: [afid(t, label)] if t == 60 else [])
    (event,) = starts(found, "ras-event")
    assert (event.gpu_uuid, event.ts_ns, event.severity) == ("GPU-2", T0 + 60 * S, severity)
    assert words in event.summary and "AFID 30" in event.summary and "AFID Event List" in event.action
    assert health(event) == (state, remedy)
    assert [f.detector for f in starts(found)] == ["ras-event"]  # nothing else on the node


def test_a_corrected_event_ends_when_quiet_and_a_fatal_one_only_after_ten_quiet_minutes_of_its_own() -> None:
    _det, found, _ = run(400, events=lambda t: [afid(t, "non_fatal_corrected")] if t == 60 else [])
    (end,) = [f for f in found if f.detector == "ras-event" and not f.active]
    assert end.ts_ns == T0 + 360 * S  # its quiet window, as an XID's (storm_window_s, 300 s)
    _det, found, _ = run(800, events=lambda t: [afid(t, "fatal")] if t == 60 else [])
    (end,) = [f for f in found if f.detector == "ras-event" and not f.active]
    assert end.ts_ns == T0 + 660 * S
    # the GPU stops reporting after the error: its silence is no recovery, the finding stays open

    def silent(t: int, gpu: int, m: dict[str, float]) -> dict[str, float] | None:
        return None if gpu == 2 and t > 100 else m

    _det, found, _ = run(900, silent, events=lambda t: [afid(t, "fatal")] if t == 60 else [])
    assert [f.active for f in found if f.detector == "ras-event"][-1]


def test_a_worse_event_raises_the_open_episode_and_a_milder_one_does_not_lower_it() -> None:
    def events(t: int) -> list[GpuEvent]:
        return {
            60: [afid(t, "non_fatal_corrected", 7)],
            70: [afid(t, "fatal", 30)],
            80: [afid(t, "non_fatal_corrected", 8)],
        }.get(t, [])

    _det, found, _ = run(300, events=events)
    assert len(starts(found, "ras-event")) == 1  # one episode
    said = [f for f in found if f.detector == "ras-event" and f.active]
    raised = next(f for f in said if f.ts_ns == T0 + 70 * S)  # said when it got worse, not at the next repeat
    assert raised.severity == "critical" and "fatal hardware error (CPER severity fatal, AFID 30)" in raised.summary
    assert health(raised) == (Health.UNHEALTHY, Remedy.RESET_GPU)
    assert all(f.severity == "critical" for f in said if f.ts_ns >= raised.ts_ns)  # the corrected one after it
