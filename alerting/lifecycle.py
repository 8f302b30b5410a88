"""The alert lifecycle, one pure state machine per dedup key: pending -> firing -> resolved, with hysteresis,
flap detection and staleness. No I/O and no clock: callers pass the finding or ``now_ns``.

* ``apply_finding``: a Finding (active or cleared) moves the alert. Findings are applied in event time and
  only if newer than the last one applied, so a replay after a crash changes nothing.
* ``tick``: timers. A pending alert fires once its condition has held ``for_s``; a cleared firing alert
  resolves after ``keep_firing_s``; a flapping alert that has been stable for ``flap_quiet_s`` stops
  flapping and its period is counted (one summary per period goes out, see grouping).

Silence is evidence of nothing: an alert whose finding stopped repeating for ``stale_after_s`` (its GPU, its node
or the whole fleet stopped reporting, or the processor stopped) is marked stale (``stale_since_ns``: the last
finding's time) and stays as it was: a firing alert keeps firing (an uncorrectable ECC error on a node that then
went dark is still an uncorrectable ECC error), a pending one stays pending and does not fire on silence. Only a
finding ends it: a clear resolves it, a repeat takes the mark away. Nothing resolves because telemetry stopped.

Flapping: ``flap_threshold`` firing/resolved changes within ``flap_window_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from alerting.model import AlertState, AlertStatus, finding_labels
from pipeline.config import AlertSettings
from pipeline.events import Finding
from pipeline.vocab import utc_text

_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class LifecycleConfig:
    for_ns: int
    keep_firing_ns: int
    stale_ns: int
    flap_threshold: int
    flap_window_ns: int
    flap_quiet_ns: int
    forget_ns: int

    @classmethod
    def of(cls, s: AlertSettings) -> LifecycleConfig:
        return cls(
            int(s.for_s * _NS),
            int(s.keep_firing_s * _NS),
            int(s.stale_after_s * _NS),
            s.flap_threshold,
            int(s.flap_window_s * _NS),
            int(s.flap_quiet_s * _NS),
            int(s.forget_after_s * _NS),
        )


def _change(
    state: AlertState, status: AlertStatus, at_ns: int, now_ns: int, cfg: LifecycleConfig, **other: object
) -> AlertState:
    """A firing/resolved change at event time ``at_ns``, seen at ``now_ns``: counted in the flap window (event
    time, so a replayed backlog does not look like flapping), and the alert starts flapping at the threshold."""
    changes = (*(t for t in state.changes if t > at_ns - cfg.flap_window_ns), at_ns)
    flapping, started, count = state.flapping, state.flap_started_ns, state.flap_changes
    if flapping:
        count += 1
    elif len(changes) >= cfg.flap_threshold:
        flapping, started, count = True, at_ns, len(changes)
    return replace(
        state,
        status=status,
        changes=changes,
        flapping=flapping,
        flap_started_ns=started,
        flap_changes=count,
        changed_at_ns=now_ns,
        **other,  # type: ignore[arg-type]
    )


def _fire(state: AlertState, at_ns: int, now_ns: int, cfg: LifecycleConfig) -> AlertState:
    return _change(
        state,
        AlertStatus.FIRING,
        at_ns,
        now_ns,
        cfg,
        starts_ns=at_ns,
        ends_ns=0,
        clear_since_ns=0,
        episode=state.episode + 1,
        resolved_reason="",
    )


def _resolve(state: AlertState, at_ns: int, now_ns: int, reason: str, cfg: LifecycleConfig) -> AlertState:
    if state.status is AlertStatus.PENDING:  # never fired: nobody was told, nothing to count
        return replace(state, status=AlertStatus.RESOLVED, ends_ns=at_ns, clear_since_ns=0, resolved_reason=reason)
    return _change(
        state, AlertStatus.RESOLVED, at_ns, now_ns, cfg, ends_ns=at_ns, clear_since_ns=0, resolved_reason=reason
    )


def apply_finding(
    state: AlertState | None, f: Finding, cfg: LifecycleConfig, now_ns: int | None = None
) -> AlertState | None:
    """The alert after finding ``f`` received at ``now_ns`` (default: its own time); None when ``f`` changes
    nothing (an old replay, or a clear of nothing)."""
    now = f.ts_ns if now_ns is None else now_ns
    if state is not None and f.ts_ns <= state.last_seen_ns:
        return None
    if not f.active and (state is None or state.status is AlertStatus.RESOLVED):
        return None
    labels = finding_labels(f)
    if state is None or state.status is AlertStatus.RESOLVED:
        since = f.since_ns if 0 < f.since_ns <= f.ts_ns else f.ts_ns
        base = state or AlertState(f.dedup_key, labels, f.summary, AlertStatus.RESOLVED, since, f.ts_ns)
        state = replace(base, status=AlertStatus.PENDING, active_since_ns=since, clear_since_ns=0)
    state = replace(
        state,
        labels=labels,
        summary=f.summary,
        action=f.action,
        evidence=dict(f.evidence),
        last_seen_ns=f.ts_ns,
        seen_at_ns=now,
        stale_since_ns=0,
    )
    if f.active:
        if state.status is AlertStatus.FIRING and state.clear_since_ns:
            state = replace(state, clear_since_ns=0)  # cleared for less than keep_firing: it never resolved
    elif state.status is AlertStatus.PENDING:
        return _resolve(state, f.ts_ns, now, "cleared", cfg)
    elif state.clear_since_ns:
        return state
    else:
        state = replace(state, clear_since_ns=f.ts_ns)
    return _timers(state, max(now, f.ts_ns), f.ts_ns, cfg) or state


def tick(state: AlertState, now_ns: int, cfg: LifecycleConfig) -> AlertState | None:
    """The alert after its timers ran at ``now_ns``; None when nothing is due."""
    return _timers(state, now_ns, now_ns, cfg)


def _timers(state: AlertState, now_ns: int, event_ns: int, cfg: LifecycleConfig) -> AlertState | None:
    """Timers at ``now_ns``; a change they make happens at ``event_ns`` in event time (a finding's own time when
    a finding triggers it). Staleness and the flap quiet period count from whichever is later, the event time
    or the time the manager saw it: neither a backlog replayed after a restart nor a clock that runs behind the
    processor's makes an alert stale or ends a flapping period early. Staleness only marks (module docstring)."""
    out = state
    seen = max(out.last_seen_ns, out.seen_at_ns)
    silent = out.status is not AlertStatus.RESOLVED and not out.clear_since_ns and now_ns - seen > cfg.stale_ns
    if silent and not out.stale_since_ns:
        out = replace(out, stale_since_ns=out.last_seen_ns)
    if out.status is AlertStatus.PENDING:
        if not out.stale_since_ns and now_ns - out.active_since_ns >= cfg.for_ns:
            out = _fire(out, max(event_ns, out.active_since_ns), now_ns, cfg)
    elif out.status is AlertStatus.FIRING and out.clear_since_ns and now_ns - out.clear_since_ns >= cfg.keep_firing_ns:
        out = _resolve(out, out.clear_since_ns, now_ns, "cleared", cfg)
    if out.flapping and out.changes and now_ns - max(out.changes[-1], out.changed_at_ns) >= cfg.flap_quiet_ns:
        out = replace(out, flapping=False, flap_periods=out.flap_periods + 1)
    return None if out is state else out


def forgettable(state: AlertState, now_ns: int, cfg: LifecycleConfig) -> bool:
    """A resolved, non-flapping alert nobody needs any more (its state can be tombstoned)."""
    return state.status is AlertStatus.RESOLVED and not state.flapping and now_ns - state.ends_ns > cfg.forget_ns


def flap_note(state: AlertState) -> str:
    """The summary line of the last flapping period (empty when the alert never flapped)."""
    if not state.flap_periods:
        return ""
    last = state.changes[-1] if state.changes else state.flap_started_ns
    minutes = max(0.0, (last - state.flap_started_ns) / 60e9)
    return (
        f"flapped: {state.flap_changes} firing/resolved changes in {minutes:.1f} min; notifications were held "
        f"until it was stable, now {state.status.value}"
    )


def stale_note(stale_since_ns: int) -> str:
    """What a stale alert says beside its summary (notifications, ``hermeneut alerts``, ``hermeneut health``)."""
    since = utc_text(stale_since_ns)
    return (
        f"stale: no finding since {since} (its GPU, node or the processor went quiet); kept open, since silence is "
        "no evidence that it cleared"
    )
