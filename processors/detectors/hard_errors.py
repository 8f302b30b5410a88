"""Hard errors: XIDs (single ones and storms), uncorrectable ECC errors, row remaps waiting for a reset, and a GPU
fallen off the bus; with the XID catalogue they are judged by.

**The XID catalogue**: what an NVIDIA XID number means, how bad it is, what to do, and whose fault it is. Source:
NVIDIA, "Xid Errors" / "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html: mnemonic, description, immediate and
investigatory resolution buckets such as RESTART_APP, RESET_GPU, RESTART_BM, CONTACT_SUPPORT) and "Dynamic Page
Retirement" (https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html: XID 48/63/64). The
meanings are paraphrased; the severity and the action are our reading of NVIDIA's resolution buckets for an
operator of a shared fleet: an application error (``app``) is the tenant's to fix and is a warning; a hardware
error is critical when NVIDIA's bucket needs a GPU reset, a node reboot or support; XID 45, the driver's cleanup
after an application's end, is info and never counts towards a storm (:data:`FOLLOWERS`). ``memory`` marks the XIDs that
report a memory (ECC) error: the ``ecc-uncorrectable`` detector owns those, so they do not count towards an XID
storm. An XID missing from the table is reported as "unknown XID" (warning, "look it up in NVIDIA's Xid catalog"),
never dropped.

**The rules** (:class:`HardErrors`), on events (XID, double-bit ECC, row remap, GPU lost) and on the counters of
every sample: ``storm_count`` XIDs within ``storm_window_s`` are a storm (fewer: one ``xid`` finding; an XID 45
joins an open one without taking its place); an
uncorrectable ECC error (a counter rising, a remap failure, an ECC XID; XID 94 only with the ECC counters rising
within 2 minutes, as it also comes in storms of application errors) clears after 10 quiet minutes unless a remap
still waits for a reset; a GPU missing from three of its own polls (three of its sampling intervals; ``lost_after_s``
when its samples do not say their interval) while its node reports has fallen off the bus, and is back once it
reports for 30 s.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline import afid
from pipeline.config import DetectorSettings
from pipeline.events import METRIC_INDEX, SEVERITY_RANK, EventKind, Finding, GpuEvent, Severity
from pipeline.kinds import ECC, LOST_BUS, RAS, REMAP, STORM, XID
from processors.detectors.columns import S, col, fmt
from processors.detectors.findings import Reporter
from processors.detectors.gpus import COUNTER, GpuView, Latest, NodeClock
from processors.episodes import Description, Episode
from processors.state import GpuSlots, column


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
        Xid(
            13,
            "graphics engine exception (illegal instruction or address in a kernel)",
            _W,
            "check the application (out-of-bounds access, bad kernel); restart it",
            "app",
        ),
        Xid(
            31,
            "GPU memory page fault (illegal memory access by the application)",
            _W,
            "check the application for an illegal memory access; restart it",
            "app",
        ),
        Xid(32, "invalid or corrupted push buffer stream", _W, _RESTART_APP, "driver"),
        Xid(38, "driver firmware error", _C, _RESET, "driver"),
        Xid(
            43,
            "GPU stopped processing (a channel was reset after an application error)",
            _W,
            "the GPU is usually fine: restart the application",
            "app",
        ),
        Xid(
            45,
            "preemptive cleanup: the driver tore down the channels of an application that aborted or was killed",
            Severity.INFO,
            "nothing to do on the GPU; after another XID, follow that one; alone, restart the application if it "
            "did not mean to exit",
            "app",
        ),
        Xid(46, "GPU stopped processing", _C, _RESET, "hardware"),
        Xid(
            48,
            "double-bit (uncorrectable) ECC error",
            _C,
            "drain the GPU and reset it to retire the page / remap the row; replace it if it recurs",
            "memory",
            memory=True,
        ),
        Xid(61, "internal micro-controller breakpoint/warning", _C, _RESET, "driver"),
        Xid(62, "internal micro-controller halt", _C, _RESET, "driver"),
        Xid(
            63,
            "ECC page retirement or row remapping recorded (reset to activate)",
            _W,
            "schedule a GPU reset at the next drain to activate the retirement/remap",
            "memory",
            memory=True,
        ),
        Xid(
            64,
            "ECC page retirement or row remapping failure",
            _C,
            "drain the GPU: the bad memory could not be retired; replace the GPU",
            "memory",
            memory=True,
        ),
        Xid(68, "video processor exception", _W, _RESTART_APP, "hardware"),
        Xid(69, "graphics engine class error", _W, _RESTART_APP, "app"),
        Xid(74, "NVLink error", _C, "drain the node; check NVLink/NVSwitch and reset the GPUs", "hardware"),
        Xid(
            79,
            "GPU has fallen off the bus",
            _C,
            "drain the node and reboot it; reseat the GPU / check its power and riser if it recurs",
            "hardware",
        ),
        Xid(
            92,
            "high single-bit ECC error rate",
            _W,
            "watch the GPU's ECC counters; plan a replacement if the rate keeps rising",
            "memory",
            memory=True,
        ),
        Xid(
            94,
            "contained uncorrectable ECC error (the application using the memory was stopped)",
            _C,
            "restart the application; reset the GPU at the next drain to remap the row",
            "memory",
            memory=True,
        ),
        Xid(
            95,
            "uncontained uncorrectable ECC error",
            _C,
            "drain the GPU and reset it now: every application on it is affected",
            "memory",
            memory=True,
        ),
        Xid(109, "context switch timeout", _W, _RESTART_APP, "app"),
        Xid(119, "GSP RPC timeout", _C, _RESET, "driver"),
        Xid(120, "GSP error", _C, _RESET, "driver"),
        Xid(121, "C2C link corrected error", _W, "watch; report to NVIDIA support if it recurs", "hardware"),
        Xid(140, "ECC unrecovered error", _C, _RESET, "memory", memory=True),
        Xid(154, "GPU recovery action changed (reset or reboot required)", _C, _REBOOT, "driver"),
    )
}

#: XIDs that mean the GPU is gone from the bus (the fallen-off-bus detector owns them)
LOST: Final = frozenset({79})
#: XIDs that report an uncorrectable memory error (the ecc-uncorrectable detector owns them)
UNCORRECTABLE: Final = frozenset({48, 64, 94, 95, 140})
#: XIDs that follow another XID or a process's end and never count towards a storm: NVIDIA's Xid catalogue resolves
#: XID 45 (ROBUST_CHANNEL_PREEMPTIVE_REMOVAL, "logged when the user application aborts and the kernel driver tears
#: down" its channels) as "Solo: RESTART_APP / Not solo: IGNORE (follow other Xid)". Counted, a teardown's burst is a
#: storm: after one multi-node NVLink job crash on a GB300 NVL72 cluster, 77 nodes across 11 racks were flagged by
#: the XID 45 bursts of the teardown, every GPU healthy (NVSentinel #1629); a 288-node GB200 fleet logged 168,924
#: XID 45 against 10 of every other XID in two days, and its repeat rule raised 672 fatal events in 3 hours from
#: normal application churn (NVSentinel #1710, fixed by excluding XID 45 in #1712)
FOLLOWERS: Final = frozenset({45})


def _worse(code: int, than: int) -> bool:
    """XID ``code`` is more severe than XID ``than``."""
    return SEVERITY_RANK[describe(code).severity] > SEVERITY_RANK[describe(than).severity]


def describe(code: int) -> Xid:
    """The catalogue entry for ``code``; an unknown XID gets a generic entry instead of an error."""
    known = CATALOGUE.get(code)
    if known is not None:
        return known
    return Xid(code, f"unknown XID {code}", Severity.WARNING, "look it up in NVIDIA's Xid catalog", "unknown")


# --- the rules -----------------------------------------------------------------------------------------------------

_CONTAINED_ECC: Final = 94
#: quiet this long (s) and an ECC or remap finding clears (unless a remap still waits for a reset)
_MEMORY_QUIET_S: Final = 600.0
#: a GPU back on the bus is back once it reports this long (s)
_BACK_S: Final = 30
#: a GPU is silent after missing this many of its own polls while its node's other GPUs are read: the poller reads
#: every GPU of a node in one round, so a GPU absent from three rounds in a row is not a late round (the whole node
#: would be late) nor one dropped reading (a single missed poll stays quiet); one poll later at 1 s than at 60 s
_MISSED_SAMPLES: Final = 3
_INTERVAL: Final = METRIC_INDEX["sample_interval_seconds"]
#: the flags of a remap or retirement waiting for the GPU's reset
_PENDING: Final = np.array([METRIC_INDEX["row_remap_pending"], METRIC_INDEX["retired_pages_pending"]])


@dataclass(eq=False)
class _Evidence:
    """Per GPU: the last time new ECC and remap evidence came in, and the first sample after a silence."""

    ecc_ts: np.ndarray = column(-1, dtype=np.int64)
    remap_ts: np.ndarray = column(-1, dtype=np.int64)
    back_since: np.ndarray = column(-1, dtype=np.int64)


class HardErrors:
    """The hard-error findings per GPU (see module docstring)."""

    names = (STORM, ECC, LOST_BUS, XID, REMAP, RAS)

    def __init__(
        self, slots: GpuSlots, settings: DetectorSettings, latest: Latest, nodes: NodeClock, report: Reporter
    ) -> None:
        self.slots = slots
        self.settings = settings
        self.latest = latest
        self.nodes = nodes
        self.report = report
        self.evidence = slots.attach(_Evidence())
        self._xids: dict[int, deque[tuple[int, int]]] = {}
        #: per GPU: its last AMD RAS event's time and AFID, and the worst CPER severity of its open episode
        self._ras: dict[int, tuple[int, int, str]] = {}
        slots.on_free(self._forget)

    def _forget(self, gpus: np.ndarray, _nodes: np.ndarray) -> None:
        """A freed lane's slots go to other GPUs: their XIDs do not count towards those GPUs' storms."""
        for slot in gpus.tolist():
            self._xids.pop(slot, None)
            self._ras.pop(slot, None)

    def events(self, events: tuple[GpuEvent, ...], out: list[Finding]) -> None:
        """A batch's GPU events, in time order (a GPU known only from its events gets a slot of its own)."""
        gpus = self.report.gpus
        for e in sorted(events, key=lambda ev: ev.ts_ns):
            slot = self.slots.slot((e.cluster, e.node, e.gpu_uuid), e.gpu_index, "", e.ts_ns)
            node = int(self.slots.node_of[slot])
            self.nodes.latest[node] = max(int(self.nodes.latest[node]), e.ts_ns)
            if e.kind is EventKind.GPU_LOST or (e.kind is EventKind.XID and e.code in LOST):
                if not gpus.is_open(slot, LOST_BUS):
                    self.report.transition(slot, LOST_BUS, True, e.ts_ns, out, {"xid": float(e.code), "event": 1.0})
                continue
            if e.kind is EventKind.ECC_DOUBLE_BIT or (e.kind is EventKind.XID and self._ecc_xid(slot, e)):
                self._memory_evidence(slot, e.ts_ns, ECC, {"xid": float(e.code)}, out)
                continue
            if e.kind is EventKind.ROW_REMAP or (
                e.kind is EventKind.XID and describe(e.code).memory and e.code != _CONTAINED_ECC
            ):
                self._memory_evidence(slot, e.ts_ns, REMAP, {"xid": float(e.code)}, out)
                continue
            if e.kind is EventKind.AFID:
                self._ras_event(slot, e, out)
                continue
            if e.kind is not EventKind.XID:
                continue
            self._xid(slot, e, out)

    def _xid(self, slot: int, e: GpuEvent, out: list[Finding]) -> None:
        """One XID: ``storm_count`` of them within ``storm_window_s`` (a follower, :data:`FOLLOWERS`, not counted)
        open a storm, fewer one ``xid`` finding. A follower joins an open finding without taking its place (the XID
        it follows says what to do); one that is worse than the open finding's XID is said at once."""
        cfg, gpus = self.settings, self.report.gpus
        self._end_if_quiet(slot, e.ts_ns, out)
        window = self._xids.setdefault(slot, deque())
        window.append((e.ts_ns, e.code))
        while window and window[0][0] < e.ts_ns - cfg.storm_window_s * S:
            window.popleft()
        counted = sum(1 for _, code in window if code not in FOLLOWERS)
        if e.code not in FOLLOWERS and counted >= cfg.storm_count and not gpus.is_open(slot, STORM):
            if gpus.is_open(slot, XID):
                self.report.transition(slot, XID, False, e.ts_ns, out)
            self.report.transition(slot, STORM, True, e.ts_ns, out, {"xid": float(e.code)})
            return
        name = STORM if gpus.is_open(slot, STORM) else XID if gpus.is_open(slot, XID) else None
        if name is None:
            self.report.transition(slot, XID, True, e.ts_ns, out, {"xid": float(e.code)})
            return
        if e.code in FOLLOWERS:
            return
        episode = gpus.get(slot, name)
        before = int(episode.detail.get("xid", e.code))
        episode.detail["xid"] = float(e.code)
        if name == XID and _worse(e.code, before):
            self.report.send(slot, XID, True, e.ts_ns, out)

    def _ras_event(self, slot: int, e: GpuEvent, out: list[Finding]) -> None:
        """An AMD RAS event (its AFID and CPER severity, pipeline.afid) opens a ``ras-event`` finding, or joins the
        open one, which keeps the worst severity it has seen (a worse one is said at once) and the last AFID; one
        that had gone quiet before it ends where it went quiet first."""
        gpus = self.report.gpus
        self._end_if_quiet(slot, e.ts_ns, out, (RAS,))
        label = afid.label_of(e.detail)
        known = self._ras.get(slot)
        worst = afid.worse(known[2], label) if known is not None and gpus.is_open(slot, RAS) else label
        self._ras[slot] = (e.ts_ns, e.code, worst)
        detail = {"afid": float(e.code), "cper": float(afid.judge(worst).cper)}
        if not gpus.is_open(slot, RAS):
            self.report.transition(slot, RAS, True, e.ts_ns, out, detail)
            return
        raised = known is not None and worst != known[2]
        gpus.get(slot, RAS).detail.update(detail)
        if raised:  # worse than it was: said at once, not at the next repeat
            self.report.send(slot, RAS, True, e.ts_ns, out)

    def _end_if_quiet(self, slot: int, ts_ns: int, out: list[Finding], names: tuple[str, ...] = (STORM, XID)) -> None:
        """An open XID or storm (or the first open one of ``names``) that had gone quiet before an event at ``ts_ns``
        ends where it went quiet, and the event starts an episode of its own: whatever the batching (a replay's or a
        backfill's batch may hold both, and the quiet check after the batch would merge them), one XID a minute for
        five minutes is five episodes when the quiet window is shorter, the count escalation reads
        (pipeline/escalation.py)."""
        gpus = self.report.gpus
        name = next((n for n in names if gpus.is_open(slot, n)), None)
        end = None if name is None else self.quiet_end(slot, name, gpus.get(slot, name))
        if name is not None and end is not None and end <= ts_ns:
            self.report.transition(slot, name, False, end, out)

    def _ecc_xid(self, slot: int, e: GpuEvent) -> bool:
        """Whether an XID reports an uncorrectable memory error. 94 (contained ECC error) also shows up in storms
        of application errors, so it counts as memory evidence only when the GPU's ECC counters rose within 2
        minutes or an ECC finding is open; alone it is one more XID."""
        if e.code not in UNCORRECTABLE:
            return False
        if e.code != _CONTAINED_ECC:
            return True
        return self.report.gpus.is_open(slot, ECC) or abs(e.ts_ns - int(self.evidence.ecc_ts[slot])) <= 120 * S

    def _lost_after_ns(self, slots: np.ndarray) -> np.ndarray:
        """How long each GPU must be silent to be lost: three of its own sampling intervals (3 s at 1 s, 3 min for
        imported history every minute: its interval is not a GPU off the bus), ``lost_after_s`` where its samples
        do not say their interval."""
        interval: np.ndarray = self.latest.row[slots, _INTERVAL]
        known = np.isfinite(interval) & (interval > 0)
        seconds = np.where(known, _MISSED_SAMPLES * np.where(known, interval, 0.0), self.settings.lost_after_s)
        lost_after: np.ndarray = (seconds * S).astype(np.int64)
        return lost_after

    def returns(self, g: np.ndarray, ts: np.ndarray) -> None:
        """One row per GPU ``g`` (before it becomes the GPU's latest): a row after a silence starts its return."""
        last = self.latest.ts[g]
        gap = (last >= 0) & (ts - last >= self._lost_after_ns(g))
        self.evidence.back_since[g[gap]] = ts[gap]

    def counters(self, g: np.ndarray, ts: np.ndarray, m: np.ndarray, deltas: np.ndarray, out: list[Finding]) -> None:
        """One row per GPU ``g`` with the rises of its error counters (gpus.COUNTERS) since its previous row."""
        uncorrectable = (
            (deltas[:, COUNTER["ecc_uncorrected_total"]] > 0)
            | (deltas[:, COUNTER["row_remap_uncorrectable_total"]] > 0)
            | (deltas[:, COUNTER["retired_pages_dbe_total"]] > 0)
            | (col(m, "row_remap_failure") == 1)
        )
        pending = (col(m, "row_remap_pending") == 1) | (col(m, "retired_pages_pending") == 1)
        remapped = pending | (deltas[:, COUNTER["row_remap_correctable_total"]] > 0)
        for i in np.flatnonzero(uncorrectable).tolist():
            self._memory_evidence(int(g[i]), int(ts[i]), ECC, {"ecc_uncorrected_delta": float(deltas[i, 0])}, out)
        for i in np.flatnonzero(remapped & ~uncorrectable).tolist():
            self._memory_evidence(int(g[i]), int(ts[i]), REMAP, {}, out)

    def _memory_evidence(self, slot: int, ts: int, name: str, detail: dict[str, float], out: list[Finding]) -> None:
        gpus = self.report.gpus
        if name == ECC:
            self.evidence.ecc_ts[slot] = ts
            if gpus.is_open(slot, REMAP):
                self.report.transition(slot, REMAP, False, ts, out)
        else:
            self.evidence.remap_ts[slot] = ts
            if gpus.is_open(slot, ECC):
                return  # the remap is part of the uncorrectable error already reported
        if not gpus.is_open(slot, name):
            self.report.transition(slot, name, True, ts, out, detail)
        else:
            episode = gpus.get(slot, name)
            for key, value in detail.items():
                if key != "xid":
                    episode.detail[key] = episode.detail.get(key, 0.0) + value
                elif key not in episode.detail or _worse(int(value), int(episode.detail[key])):
                    episode.detail[key] = value  # the XID that opened it, unless a worse one follows

    def lost_and_back(self, out: list[Finding]) -> None:
        """GPUs silent while their node still reports have fallen off the bus (dated when the silence became
        evident, whatever the batching: a replay finds the same time); one that reports again for 30 s is back."""
        used = len(self.slots)
        last_ts = self.latest.ts[:used]
        node_now = self.nodes.latest[self.slots.node_of[:used]]
        lost_after = self._lost_after_ns(np.arange(used))
        silent = (last_ts >= 0) & (node_now - last_ts >= lost_after)
        lost = self.report.gpus.active(np.arange(used), LOST_BUS)
        for slot in np.flatnonzero(silent & ~lost).tolist():
            self.report.transition(slot, LOST_BUS, True, int(last_ts[slot] + lost_after[slot]), out)
        for slot in np.flatnonzero(lost & ~silent).tolist():
            back = max(int(self.evidence.back_since[slot]), self.report.gpus.get(slot, LOST_BUS).since_ns)
            if last_ts[slot] - back >= _BACK_S * S:
                self.report.transition(slot, LOST_BUS, False, back + _BACK_S * S, out)

    def quiet_end(self, slot: int, name: str, episode: Episode) -> int | None:
        """When an open XID, storm, ECC or remap finding goes (went) quiet: its last evidence plus its quiet window,
        the data time it ends whatever the batching; None: it does not end by quiet (another kind, or a remap
        waiting for a reset, which keeps a memory finding open: the GPU still needs that reset)."""
        if name in (STORM, XID):
            xids = self._xids.get(slot)
            since, quiet_for = max(xids[-1][0] if xids else 0, episode.since_ns), self.settings.storm_window_s
        elif name == RAS and (ras := self._ras.get(slot)) is not None and ras[2] == "fatal":
            return self._quiet_samples_end(slot, ras[0], episode)  # a fatal error, as an uncorrectable ECC error
        elif name == RAS:
            ras = self._ras.get(slot)
            since, quiet_for = (ras[0] if ras else episode.since_ns), self.settings.storm_window_s
        elif name in (ECC, REMAP):
            if (self.latest.row[slot, _PENDING] == 1).any():  # a row remap (Ampere+) or page retirement (Volta)
                return None
            # a pending remap is evidence until the reset: the quiet time counts from its last row, not from before
            remap = int(self.evidence.remap_ts[slot])
            evidence = max(int(self.evidence.ecc_ts[slot]), remap) if name == ECC else remap
            return self._quiet_samples_end(slot, evidence, episode)
        else:
            return None
        return max(episode.since_ns, since + int(quiet_for * S))

    def _quiet_samples_end(self, slot: int, evidence_ns: int, episode: Episode) -> int | None:
        """When a finding that silence must not end ends: ``_MEMORY_QUIET_S`` of the GPU's own samples after its
        last evidence (and after its return from a gap: silence is no recovery); None until its samples reach it."""
        since = max(evidence_ns, int(self.evidence.back_since[slot]))
        end = max(episode.since_ns, since + int(_MEMORY_QUIET_S * S))
        return end if int(self.latest.ts[slot]) >= end else None

    def describe(self, name: str, gpu: GpuView, episode: Episode, ts_ns: int) -> Description:
        if name in (STORM, XID):
            return self._xid_words(gpu.slot, name == STORM, episode, ts_ns)
        if name == ECC:
            return _ecc_words(gpu, episode)
        if name == REMAP:
            return _remap_words(gpu, episode)
        if name == RAS:
            ras = self._ras.get(gpu.slot)
            return _ras_words(ras[2] if ras else "", episode)
        node_now = int(self.nodes.latest[self.slots.node_of[gpu.slot]])
        # as of the finding's own time (a start is dated when the silence became evident; the batch that noticed it
        # may reach further: "silent for 26 s" after 15 s on a real trace, issue 38)
        silent = max(0.0, (min(ts_ns, node_now) - int(self.latest.ts[gpu.slot])) / S)
        how = "XID 79 / GPU lost" if episode.detail.get("event") else "no samples"
        what = f"fallen off the bus: {how}; silent for {silent:.0f} s while the node's other GPUs keep reporting"
        action = "drain the node and reboot it; reseat the GPU and check its power cables and riser if it happens again"
        evidence = {"silent_s": silent, "xid": episode.detail.get("xid", math.nan)}
        return Description(Severity.CRITICAL, what, action, evidence)

    def _xid_words(self, slot: int, storm: bool, episode: Episode, ts_ns: int) -> Description:
        recent = self._xids.get(slot, deque())
        window = self.settings.storm_window_s
        within = [c for t, c in recent if t >= ts_ns - window * S]
        count = sum(1 for c in within if c not in FOLLOWERS)
        codes = sorted(set(within))
        last = describe(int(episode.detail.get("xid", codes[-1] if codes else 0)))
        if storm:
            kinds = ", ".join(f"{c} ({describe(c).meaning})" for c in codes[:5])
            hardware = any(describe(c).cause != "app" for c in codes)
            cleanups = len(within) - count
            besides = f" and {cleanups} XID 45 cleanup{'s' if cleanups > 1 else ''}" if cleanups else ""
            what = f"XID storm: {count} XIDs{besides} in {window / 60:.0f} min: {kinds}"
            action = (
                "drain the GPU and reset it; if the storm returns, report it to support"
                if hardware
                else "the job keeps crashing on this GPU: stop it and check the application; reset the GPU if it "
                "persists"
            )
            return Description(
                Severity.CRITICAL,
                what,
                action,
                {"xids_in_window": float(count), "distinct_xids": float(len(codes)), "last_xid": float(last.code)},
            )
        what = f"XID {last.code}: {last.meaning} ({last.cause} error)"
        return Description(last.severity, what, last.action, {"xid": float(last.code), "xids_in_window": float(count)})


def _ras_words(label: str, episode: Episode) -> Description:
    """An AMD RAS event in words: its CPER severity, what that means, its AFID, and what to do."""
    severity = afid.judge(label or "unknown")
    code = int(episode.detail.get("afid", 0))
    what = f"AMD RAS event: {severity.meaning} (CPER severity {severity.label}, AFID {code})"
    action = f"{severity.action}; AMD's AFID Event List gives AFID {code}'s service action ({afid.AFID_LIST})"
    return Description(severity.severity, what, action, {"afid": float(code), "cper": float(severity.cper)})


def _ecc_counts(c: dict[str, float], pending: float) -> list[str]:
    """The uncorrectable-error counts a GPU reports, in words; a count it does not report is not mentioned (an
    AMD GPU has no row remapping, a GeForce no ECC: issue 41's "rows remapped for uncorrectable errors ?")."""
    said = []
    remaps = not math.isnan(c["row_remap_uncorrectable_total"])
    if not math.isnan(c["ecc_uncorrected_total"]):
        said.append(f"{fmt(c['ecc_uncorrected_total'])} uncorrected in total")
    if remaps:
        said.append(f"rows remapped for uncorrectable errors {fmt(c['row_remap_uncorrectable_total'])}")
    elif not math.isnan(c["retired_pages_dbe_total"]):
        said.append(f"pages retired for double-bit errors {fmt(c['retired_pages_dbe_total'])}")
    if not math.isnan(pending):
        said.append(f"{'remap' if remaps else 'retirement'} pending {'yes' if pending else 'no'}")
    return said


def _ecc_words(gpu: GpuView, episode: Episode) -> Description:
    xid, c = episode.detail.get("xid"), gpu.counters
    pending = gpu.row.get("row_remap_pending", gpu.row.get("retired_pages_pending", math.nan))
    what = f"uncorrectable ECC error{f' (XID {int(xid)}: {describe(int(xid)).meaning})' if xid else ''}"
    told = ", ".join(_ecc_counts(c, pending))
    what += f": {told}" if told else ""
    action = (
        "drain the GPU and reset it to apply the row remap / page retirement; replace it if errors recur or the "
        "remap failed"
    )
    return Description(
        Severity.CRITICAL,
        what,
        action,
        {
            "ecc_uncorrected_total": c["ecc_uncorrected_total"],
            "row_remap_uncorrectable_total": c["row_remap_uncorrectable_total"],
            "retired_pages_dbe_total": c["retired_pages_dbe_total"],
            "remap_pending": pending,
            "remap_failure": gpu.row.get("row_remap_failure", math.nan),
            "xid": xid or math.nan,
        },
    )


def _remap_words(gpu: GpuView, episode: Episode) -> Description:
    c = gpu.counters
    what = (
        f"memory row remap / page retirement waiting for a GPU reset (correctable remaps "
        f"{fmt(c['row_remap_correctable_total'])})"
    )
    return Description(
        Severity.WARNING,
        what,
        "reset the GPU at its next drain to activate the remap",
        {
            "row_remap_correctable_total": c["row_remap_correctable_total"],
            "remap_pending": gpu.row.get("row_remap_pending", gpu.row.get("retired_pages_pending", math.nan)),
            "xid": episode.detail.get("xid", math.nan),
        },
    )
