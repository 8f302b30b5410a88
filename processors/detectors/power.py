"""Power capping: a power limit lowered below the one accepted for the job, away from a job boundary, is a fault.

A limit seen from a GPU's first sample, or changed within ``job_boundary_s`` of a job starting or changing (a new
job id in the context or new compute processes on the GPU; before or after: a prolog can set the limit before the
job's process starts, and context can lag), is the operator's setting: it becomes the accepted limit and never a
finding. A drop is confirmed after ``power_confirm_s``; it clears when the limit is back. Several GPUs of a node
lowered at once (confirmed together, or others still waiting for confirmation) are one cause, a failed power supply
or the rack's budget: one *node-level* finding naming them, whose summary each of their rows carries.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from pipeline.config import DetectorSettings
from pipeline.events import Finding, Severity
from pipeline.kinds import POWER
from pipeline.vocab import SW_POWER_CAP
from processors.detectors.columns import REL, S, bits, col, fmt, gt
from processors.detectors.findings import Reporter
from processors.detectors.gpus import GpuView, Latest
from processors.detectors.jobs import Boundaries
from processors.episodes import Description, Episode
from processors.state import GpuSlots, column

#: a GPU above this utilization is busy: a cap on it costs speed (warning), on an idle one it does not (info)
BUSY_UTIL = 20.0


@dataclass(eq=False)
class _Limits:
    #: the accepted limit, and a drop from it waiting for confirmation (since when, from which limit)
    accepted: np.ndarray = column(np.nan)
    drop_since: np.ndarray = column(-1, dtype=np.int64)
    drop_from: np.ndarray = column(np.nan)
    #: the GPU's lowered limit is reported by its node's finding (several GPUs of the node lowered together)
    by_node: np.ndarray = column(False)


class Power:
    """Per GPU: its accepted power limit and a drop waiting for confirmation; the findings (see module docstring)."""

    names = (POWER,)

    def __init__(
        self, slots: GpuSlots, settings: DetectorSettings, latest: Latest, jobs: Boundaries, report: Reporter
    ) -> None:
        self.slots = slots
        self.settings = settings
        self.latest = latest
        self.jobs = jobs
        self.report = report
        self.limits = slots.attach(_Limits())

    def waiting(self, slot: int) -> bool:
        """Whether a lowered limit of the GPU is waiting for its confirmation."""
        return bool(self.limits.drop_since[slot] >= 0)

    def step(self, g: np.ndarray, ts: np.ndarray, m: np.ndarray, out: list[Finding]) -> None:
        """One row per GPU ``g``."""
        cfg, lim = self.settings, self.limits
        limit = col(m, "power_limit_watts")
        ok = ~np.isnan(limit)
        g, ts, limit = g[ok], ts[ok], limit[ok]
        ref = lim.accepted[g]
        ref = np.where(np.isnan(ref), limit, ref)
        boundary = self.jobs.app_ts[g]
        since = lim.drop_since[g]
        active = self.report.gpus.active(g, POWER) | lim.by_node[g]
        pending = since >= 0
        dropped = limit < ref * 0.97
        window = cfg.job_boundary_s * S
        setting = ~active & dropped & ((ts - boundary <= window) | (pending & (boundary >= since - window)))
        begin = ~active & dropped & ~setting & ~pending
        start = ~active & dropped & ~setting & pending & (ts - since >= cfg.power_confirm_s * S)
        back = ~active & pending & ~dropped
        restored = active & (limit >= lim.drop_from[g] * 0.97)
        ref = np.where(setting | restored | (~active & ~dropped & (limit > ref)), limit, ref)
        lim.accepted[g] = ref
        lim.drop_from[g[begin]] = ref[begin]
        lim.drop_since[g] = np.where(begin, ts, np.where(setting | back | start, -1, since))
        if start.any():
            self._starts(g[start], ts[start], out)
        for i in np.flatnonzero(restored).tolist():
            slot, t = int(g[i]), int(ts[i])
            if lim.by_node[slot]:
                self._leaves_node(slot, t, out)
            else:
                self.report.transition(slot, POWER, False, t, out)

    def _starts(self, g: np.ndarray, ts: np.ndarray, out: list[Finding]) -> None:
        """Confirmed lowered limits: one node-level finding when two or more GPUs of the node are lowered at once
        (confirmed together, or others still waiting for confirmation): one cause, one finding; else per GPU."""
        lim, used = self.limits, len(self.slots)
        nodes = self.slots.node_of[g]
        for node in dict.fromkeys(nodes.tolist()):
            mine, t = g[nodes == node], int(ts[nodes == node].min())
            shared = self.report.nodes.is_open(node, POWER)
            if not shared:
                peers = np.flatnonzero(self.slots.node_of[:used] == node)
                others = peers[~np.isin(peers, mine)]
                lowered = (lim.drop_since[others] >= 0) | self.report.gpus.active(others, POWER)
                if len(mine) == 1 and not lowered.any():
                    self.report.transition(int(mine[0]), POWER, True, t, out)
                    continue
            lim.by_node[mine] = True
            self.latest.explained(mine, True, t, POWER)
            if not shared:
                self.report.node_starts(node, POWER, t, out)

    def _leaves_node(self, slot: int, ts: int, out: list[Finding]) -> None:
        used = len(self.slots)
        node = int(self.slots.node_of[slot])
        self.limits.by_node[slot] = False
        self.latest.explained(slot, False, ts, POWER)
        if not self.limits.by_node[:used][self.slots.node_of[:used] == node].any():
            self.report.node_clears(node, POWER, ts, out)

    def speaking_for(self) -> list[tuple[int, Episode]]:
        """(slot, its node's finding) for every GPU whose lowered limit its node's finding reports."""
        return [
            (slot, self.report.nodes.get(int(self.slots.node_of[slot]), POWER))
            for slot in np.flatnonzero(self.limits.by_node[: len(self.slots)]).tolist()
        ]

    def describe(self, name: str, gpu: GpuView, episode: Episode, ts_ns: int) -> Description:
        row, rel, nan = gpu.row, gpu.rel, math.nan
        limit, before = row.get("power_limit_watts", nan), float(self.limits.drop_from[gpu.slot])
        default = row.get("power_default_limit_watts", nan)
        capped = bool(int(row.get("throttle_reasons_mask", 0)) & SW_POWER_CAP)
        what = (
            f"power limit lowered to {fmt(limit, ' W')} from {fmt(before, ' W')} mid-job (default "
            f"{fmt(default, ' W')}){', clocks held by the SW power cap' if capped else ''}: SM clock "
            f"{fmt(rel.get('sm_clock_ratio_of_max', nan) * 100, '%')} of max, drawing "
            f"{fmt(row.get('power_watts', nan), ' W')}"
        )
        action = (
            "find who lowered the power limit (nvidia-smi -pl, a power-capping policy, the rack's power budget) "
            "and restore it"
        )
        busy = row.get("utilization_gpu_percent", 0.0) > BUSY_UTIL
        return Description(
            Severity.WARNING if busy else Severity.INFO,
            what,
            action,
            {
                "power_limit_w": limit,
                "previous_limit_w": before,
                "default_limit_w": default,
                "power_w": row.get("power_watts", nan),
                "sm_clock_ratio": rel.get("sm_clock_ratio_of_max", nan),
                "sw_power_cap": float(capped),
            },
        )

    def describe_node(self, name: str, slots: np.ndarray) -> Description:
        """A node's GPUs whose limits were lowered together (those still waiting for their confirmation too: the
        same cause lowered them)."""
        members = slots[self.limits.by_node[slots] | (self.limits.drop_since[slots] >= 0)]
        rows = self.latest.row[members]
        limit = col(rows, "power_limit_watts")
        default = col(rows, "power_default_limit_watts")
        before = self.limits.drop_from[members]
        busy = gt(col(rows, "utilization_gpu_percent"), BUSY_UTIL)
        capped = busy & bits(col(rows, "throttle_reasons_mask"), SW_POWER_CAP)
        clock = self.latest.rel[members, REL["sm_clock_ratio_of_max"]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: shown as "?"
            lo, hi = float(np.nanmin(limit)), float(np.nanmax(limit))
            share = float(np.nanmedian(limit / default))
            was = float(np.nanmedian(before))
            busy_clock = float(np.nanmedian(clock[busy])) if busy.any() else math.nan
        indexes = ", ".join(str(self.slots.index(s)) for s in members.tolist())
        watts = fmt(lo, " W") if hi - lo < 1 else f"{fmt(lo)}-{fmt(hi, ' W')}"
        what = (
            f"power capping on {len(members)} of {len(slots)} GPUs at once (GPU {indexes}): limit lowered mid-job to "
            f"{watts} from {fmt(was, ' W')} ({fmt(share * 100, '%')} of default)"
            + (
                f"; {int(capped.sum())} busy GPUs held by the SW power cap, SM clock {fmt(busy_clock * 100, '%')} of "
                "max"
                if capped.any()
                else ""
            )
        )
        action = (
            "one cause for the node: check its power supplies (BMC / ipmitool sdr: a failed or degraded PSU), the PDU "
            "or rack power budget, or a node-wide power policy; restore the limits once it is fixed"
        )
        return Description(
            Severity.WARNING if busy.any() else Severity.INFO,
            what,
            action,
            {
                "gpus_capped": float(len(members)),
                "gpus_on_node": float(len(slots)),
                "busy_gpus_capped": float(capped.sum()),
                "power_limit_w": lo,
                "previous_limit_w": was,
                "limit_ratio_of_default": share,
                "sm_clock_ratio": busy_clock,
            },
        )
