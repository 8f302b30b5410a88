"""The per-alert state machine: firing, resolving, hysteresis, replays, staleness and flapping."""

from __future__ import annotations

from alerting.lifecycle import LifecycleConfig, apply_finding, flap_note, forgettable, stale_note, tick
from alerting.model import AlertState, AlertStatus
from tests.unit.alerting.helpers import S, finding, settings


def _run(cfg: LifecycleConfig, events: list[tuple[bool, float]]) -> AlertState:
    state: AlertState | None = None
    for active, ts in events:
        state = apply_finding(state, finding(active, ts), cfg) or state
    assert state is not None
    return state


def test_fires_repeats_quietly_and_resolves_at_the_clear() -> None:
    cfg = LifecycleConfig.of(settings())
    a = apply_finding(None, finding(True, 100, since_s=70), cfg)
    assert a is not None and a.status is AlertStatus.FIRING and a.episode == 1 and a.starts_ns == 100 * S
    assert a.active_since_ns == 70 * S and a.labels["detector"] == "thermal-throttling"
    b = apply_finding(a, finding(True, 160, since_s=70), cfg)
    assert b is not None and b.status is AlertStatus.FIRING and b.episode == 1 and b.signature == a.signature
    c = apply_finding(b, finding(False, 200), cfg)
    assert c is not None and c.status is AlertStatus.RESOLVED and c.ends_ns == 200 * S
    assert c.resolved_reason == "cleared" and c.signature == "R1.0"
    assert apply_finding(c, finding(False, 260), cfg) is None  # a second clear changes nothing


def test_replayed_and_out_of_order_findings_change_nothing() -> None:
    cfg = LifecycleConfig.of(settings())
    a = _run(cfg, [(True, 100), (True, 160)])
    assert apply_finding(a, finding(True, 160), cfg) is None
    assert apply_finding(a, finding(False, 130), cfg) is None


def test_for_duration_holds_a_pending_alert() -> None:
    cfg = LifecycleConfig.of(settings(for_s=60))
    a = apply_finding(None, finding(True, 100), cfg)
    assert a is not None and a.status is AlertStatus.PENDING
    assert tick(a, 159 * S, cfg) is None
    fired = tick(a, 160 * S, cfg)
    assert fired is not None and fired.status is AlertStatus.FIRING and fired.episode == 1
    # a condition that clears before `for` never fires and never counts as a change
    blip = _run(cfg, [(True, 1000), (False, 1030)])
    assert blip.status is AlertStatus.RESOLVED and blip.episode == 0 and blip.changes == ()


def test_keep_firing_absorbs_a_short_clear() -> None:
    cfg = LifecycleConfig.of(settings(keep_firing_s=120))
    a = _run(cfg, [(True, 100), (False, 130), (True, 200)])
    assert a.status is AlertStatus.FIRING and a.episode == 1 and a.clear_since_ns == 0
    b = _run(cfg, [(True, 100), (False, 130)])
    assert b.status is AlertStatus.FIRING
    resolved = tick(b, 250 * S, cfg)
    assert resolved is not None and resolved.status is AlertStatus.RESOLVED and resolved.ends_ns == 130 * S


def test_a_firing_alert_without_repeats_stays_open_marked_stale_until_a_finding_ends_it() -> None:
    cfg = LifecycleConfig.of(settings(stale_after_s=180))
    a = _run(cfg, [(True, 100)])
    assert tick(a, 280 * S, cfg) is None
    stale = tick(a, 281 * S, cfg)
    # silence is no evidence: still firing, marked with the last finding's time, never forgotten
    assert stale is not None and stale.status is AlertStatus.FIRING and stale.stale_since_ns == 100 * S
    assert tick(stale, 30 * 86_400 * S, cfg) is None
    assert not forgettable(stale, 30 * 86_400 * S, cfg)
    assert "stale: no finding since 1970-01-01T00:01:40Z" in stale_note(stale.stale_since_ns)
    # a repeat takes the mark away (same episode: nobody is told again); a clear resolves it
    back = apply_finding(stale, finding(True, 5000), cfg)
    assert back is not None and back.status is AlertStatus.FIRING and back.stale_since_ns == 0
    assert back.signature == a.signature
    cleared = apply_finding(stale, finding(False, 5000), cfg)
    assert cleared is not None and cleared.status is AlertStatus.RESOLVED and cleared.resolved_reason == "cleared"


def test_a_pending_alert_does_not_fire_on_silence() -> None:
    cfg = LifecycleConfig.of(settings(for_s=600, stale_after_s=180))
    a = apply_finding(None, finding(True, 100), cfg)
    assert a is not None and a.status is AlertStatus.PENDING
    stale = tick(a, 281 * S, cfg)
    assert stale is not None and stale.status is AlertStatus.PENDING and stale.stale_since_ns == 100 * S
    assert tick(stale, 10_000 * S, cfg) is None  # `for` passed in silence: it did not hold as far as anyone saw
    heard = apply_finding(stale, finding(True, 10_000), cfg)
    assert heard is not None and heard.status is AlertStatus.FIRING and heard.stale_since_ns == 0


def test_flapping_starts_at_the_threshold_and_ends_after_a_quiet_period() -> None:
    cfg = LifecycleConfig.of(settings(flap_threshold=4, flap_window_s=600, flap_quiet_s=300))
    a = _run(cfg, [(True, 100), (False, 130), (True, 160)])
    assert not a.flapping and len(a.changes) == 3
    a = _run(cfg, [(True, 100), (False, 130), (True, 160), (False, 190), (True, 220), (False, 250)])
    assert a.flapping and a.flap_started_ns == 190 * S and a.flap_changes == 6 and a.episode == 3
    assert tick(a, 540 * S, cfg) is None  # 290 s quiet: still flapping
    calm = tick(a, 550 * S, cfg)
    assert calm is not None and not calm.flapping and calm.flap_periods == 1 and calm.signature == "R3.1"
    assert "6 firing/resolved changes" in flap_note(calm) and "now resolved" in flap_note(calm)


def test_changes_outside_the_window_do_not_count() -> None:
    cfg = LifecycleConfig.of(settings(flap_threshold=4, flap_window_s=100))
    a = _run(cfg, [(True, 0), (False, 200), (True, 400), (False, 600), (True, 800)])
    assert not a.flapping and a.episode == 3


def test_a_backlog_seen_late_neither_ends_flapping_early_nor_goes_stale() -> None:
    cfg = LifecycleConfig.of(settings(flap_threshold=4, flap_window_s=600, flap_quiet_s=300, stale_after_s=180))
    lag = 1000  # every finding reaches the manager 1000 s after its own time (a backlog after a restart)
    state: AlertState | None = None
    for active, ts in [(True, 100), (False, 130), (True, 160), (False, 190)]:
        state = apply_finding(state, finding(active, ts), cfg, now_ns=(ts + lag) * S) or state
    assert state is not None and state.flapping  # the changes were 30 s apart in event time
    assert tick(state, (190 + lag + 299) * S, cfg) is None  # quiet counts from when the change was seen
    assert tick(state, (190 + lag + 300) * S, cfg) is not None
    fresh = apply_finding(None, finding(True, 100), cfg, now_ns=(100 + lag) * S)
    assert fresh is not None and fresh.status is AlertStatus.FIRING
    assert tick(fresh, (100 + lag + 180) * S, cfg) is None  # not stale: it was seen 180 s ago
