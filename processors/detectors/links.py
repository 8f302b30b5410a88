"""The GPU's links: NVLink down (fewer links active than the topology says it has) and a PCIe link trained below
its generation or width while the GPU is busy.

Both are level conditions (debounced, processors.detectors.debounce). The NVLinks a GPU should have come from the
node's topology where it counts them (asked again a minute of data time later while none is known), else from the
link count the GPU reports. A PCIe card (its model says so) reaches a peer over NVLink only through an optional
bridge: one none of whose links came up since its boot has none, and is not judged (NVSentinel #1481). An idle or
lightly loaded GPU may train its PCIe link at a lower generation to save power (gen 1 at idle is normal): generation
is judged only above 40% utilization. A narrower width is a fault once the link has been seen at its full width: a
link narrow from the GPU's first sample on is how its slot, riser or VM is built (a T4 in a cloud VM at x8 of x16),
a property, reported once as ``pcie-link-narrow`` (info) with the bandwidth it leaves, never as a fault. NVLinks not
all up in the first two minutes after a GPU's first sample, or after its return from 5 minutes of silence (a
reboot), are still training after a boot, not down (judged once they were all seen up, or after those two minutes).
The NVLink finding names the peers whose traffic now crosses PCIe, and over which path. Every claim a wording makes
is one the row shows ("while busy" only above 40% utilization).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline.events import METRIC_INDEX, NvLinkSample, Severity
from pipeline.kinds import NVLINK, PCIE, PCIE_NARROW
from processors.detectors.columns import S, col, fmt, gt, lt
from processors.detectors.debounce import Level
from processors.detectors.gpus import GpuView
from processors.episodes import Description, Episode
from processors.interpret import TopologyOf
from processors.state import GpuSlots, column

NVLINK_LEVEL = Level(NVLINK, tau_s=5.0, on=0.6, off=0.15, clear_tau_s=60.0)
PCIE_LEVEL = Level(PCIE, tau_s=15.0, on=0.6, off=0.15, clear_tau_s=120.0)
#: an idle or lightly loaded GPU may train its link at a lower generation: only judged above this
_PCIE_BUSY_UTIL: Final = 40.0
_ASK_AGAIN_NS: Final = 60 * S
#: seconds after a GPU's first sample during which NVLinks not yet all up are still training, not down
TRAINING_S: Final = 120.0
#: a GPU back after a silence this long may have been rebooted (a server's power-on self-test alone takes minutes):
#: its links train again; a shorter silence (a collector restarted, a network blip) is no boot
REBOOT_S: Final = 300.0
#: the model names of PCIe add-in cards (NVML: "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB", "NVIDIA H100 PCIe")
_PCIE_CARD: Final = re.compile(r"pcie", re.IGNORECASE)


def links_from_samples(m: np.ndarray, links: list[tuple[NvLinkSample, ...] | None]) -> None:
    """Where a source reports per-link NVLink state but not the totals, count the links (in place)."""
    active, most = METRIC_INDEX["nvlink_links_active"], METRIC_INDEX["nvlink_links_max"]
    for i in np.flatnonzero(np.isnan(m[:, active])).tolist():
        per_link = links[i]
        if per_link:
            m[i, active] = sum(1 for link in per_link if link.active)
            if np.isnan(m[i, most]):
                m[i, most] = len(per_link)


def seen_so_far(s: np.ndarray, flags: np.ndarray, before: np.ndarray, starts: np.ndarray | None = None) -> np.ndarray:
    """Per row (sorted by slot, then time; ``before``: per row, whether its GPU had shown the flag before the
    batch), whether its GPU has shown the flag up to and including this row; ``starts``: rows from which on the GPU
    starts over (a return after a silence; default: each GPU's first row of the batch)."""
    n = len(s)
    if not n:
        return np.zeros(0, dtype=bool)
    first = np.r_[True, s[1:] != s[:-1]] if starts is None else starts
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    counts = np.cumsum(flags)
    within = counts - counts[start] + flags[start]
    return np.asarray(before | (within > 0))


def full_width_seen(s: np.ndarray, m: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Per row, whether its GPU's PCIe link has been seen at its full width up to and including this row."""
    width = col(m, "pcie_link_width")
    return seen_so_far(s, ~lt(width, col(m, "pcie_link_width_max")) & ~np.isnan(width), before)


def expected_nvlinks(m: np.ndarray, expected_links: np.ndarray) -> np.ndarray:
    """Per row, the NVLinks its GPU should have: the topology's count, else the one the GPU reports."""
    return np.where(expected_links > 0, expected_links, col(m, "nvlink_links_max"))


def conditions(
    m: np.ndarray, expected_links: np.ndarray, full_seen: np.ndarray | None = None, trained: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row: NVLink down and whether that can be told; PCIe degraded and whether that can be told. A narrow link
    counts only on a GPU whose link was seen at full width (``full_seen``; every GPU when not given); NVLinks only
    once they have trained (``trained``; every GPU when not given)."""
    active = col(m, "nvlink_links_active")
    expected = expected_nvlinks(m, expected_links)
    nvlink = lt(active, expected)
    nvlink_seen = ~np.isnan(active) & gt(expected, 0)
    if trained is not None:
        nvlink_seen &= trained
    gen, gen_max = col(m, "pcie_link_gen"), col(m, "pcie_link_gen_max")
    width, width_max = col(m, "pcie_link_width"), col(m, "pcie_link_width_max")
    narrow = lt(width, width_max)
    if full_seen is not None:
        narrow &= full_seen
    loaded = gt(col(m, "utilization_gpu_percent"), _PCIE_BUSY_UTIL)
    pcie = narrow | (loaded & lt(gen, gen_max))
    pcie_seen = narrow | (loaded & ~np.isnan(gen) & ~np.isnan(gen_max))
    return nvlink, nvlink_seen, pcie, pcie_seen


@dataclass(eq=False)
class _Expected:
    #: NVLinks the topology says the GPU has (0: no topology seen yet; -1: the topology says it has none)
    links: np.ndarray = column(0.0)
    #: whether the GPU's PCIe link was ever seen at its full width, and whether the GPU was seen at all
    full_width: np.ndarray = column(False)
    seen: np.ndarray = column(False)
    #: when the GPU was first seen, and whether all its NVLinks were ever seen up (links train after a boot)
    first_ts: np.ndarray = column(-1, dtype=np.int64)
    links_up: np.ndarray = column(False)
    #: whether any of its NVLinks was seen up since its boot, and whether it is a PCIe card (its model says so)
    any_up: np.ndarray = column(False)
    card: np.ndarray = column(False)


class Links:
    """The NVLinks each GPU should have, and the link findings' wording."""

    names = (NVLINK, PCIE, PCIE_NARROW)

    def __init__(self, slots: GpuSlots, topology_of: TopologyOf) -> None:
        self.slots = slots
        self.topology_of = topology_of
        self.expected = slots.attach(_Expected())
        self._asked: dict[tuple[str, str, int], int] = {}
        slots.on_free(self._forget)

    def _forget(self, gpus: np.ndarray, _nodes: np.ndarray) -> None:
        """A freed lane is not asked about again (its number is never reused): when it was last asked goes."""
        for slot in gpus.tolist():
            self._asked.pop((*self.slots.key(slot)[:2], self.slots.lane(slot)), None)

    def refresh(self, slots: np.ndarray, now_ns: int) -> None:
        """Ask the topology of the nodes of GPUs whose NVLinks are not known yet (at most once a minute of data)."""
        fresh = np.unique(slots[self.expected.links[slots] == 0])
        for cluster, node, lane in {(*self.slots.key(x)[:2], self.slots.lane(x)) for x in fresh.tolist()}:
            # asked per lane: a history lane's data time is not its live lane's
            if now_ns - self._asked.get((cluster, node, lane), -(2**62)) < _ASK_AGAIN_NS:
                continue
            self._asked[(cluster, node, lane)] = now_ns
            topo = self.topology_of(cluster, node)
            if topo is None:
                continue
            for gpu in topo.gpus:
                known = self.slots.find((cluster, node, gpu.uuid), lane)
                if known is not None:
                    self.expected.links[known] = gpu.nvlink_links if gpu.nvlink_links > 0 else -1

    def widths(self, s: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row (sorted by slot, then time): whether its GPU's link was seen at full width so far, whether the
        row opens the property finding (narrow on the GPU's first sample) and whether it closes it (the link trained
        full for the first time)."""
        before = self.expected.full_width[s]
        seen = full_width_seen(s, m, before)
        first = np.r_[True, s[1:] != s[:-1]]
        opens = first & ~self.expected.seen[s] & lt(col(m, "pcie_link_width"), col(m, "pcie_link_width_max"))
        closes = seen & ~np.r_[False, seen[:-1]] & ~before
        closes[first] = seen[first] & ~before[first]
        last = np.r_[s[1:] != s[:-1], True]
        self.expected.full_width[s[last]] = seen[last]
        self.expected.seen[s] = True
        return seen, opens, closes

    def trained(self, s: np.ndarray, ts: np.ndarray, m: np.ndarray, back: np.ndarray | None = None) -> np.ndarray:
        """Per row (sorted by slot, then time): whether its GPU's NVLinks may be judged: all of them were seen up
        since its boot, or ``TRAINING_S`` have passed since its boot: its first sample, or its return after
        ``REBOOT_S`` of silence (``back``: the rows that return). After a boot the links train for a while (NVSentinel
        #1701: every maintenance reboot of a GB200 NVL72 fleet read as NVLink down)."""
        if not len(s):
            return np.zeros(0, dtype=bool)
        back = np.zeros(len(s), dtype=bool) if back is None else back
        boot = np.r_[True, s[1:] != s[:-1]] | back
        start = np.maximum.accumulate(np.where(boot, np.arange(len(s)), 0))
        rebooted = back[start]  # the row's stretch began with a return after a silence
        known = self.expected.first_ts[s]
        since = np.where((known >= 0) & ~rebooted, known, ts[start])
        for x in np.unique(s[known < 0]).tolist():
            self.expected.card[x] = _PCIE_CARD.search(self.slots.model(x)) is not None
        active = col(m, "nvlink_links_active")
        up = ~lt(active, expected_nvlinks(m, self.expected.links[s])) & ~np.isnan(active)
        ever = seen_so_far(s, up, self.expected.links_up[s] & ~rebooted, boot)
        any_up = seen_so_far(s, gt(active, 0), self.expected.any_up[s] & ~rebooted, boot)
        last = np.r_[s[1:] != s[:-1], True]
        self.expected.first_ts[s[last]] = since[last]
        self.expected.links_up[s[last]] = ever[last]
        self.expected.any_up[s[last]] = any_up[last]
        # a PCIe card's NVLinks reach a peer only through a bridge, which is optional: one none of whose links ever
        # came up since its boot has no bridge, unless the node's topology names NVLink peers (NVSentinel #1481: an
        # A100 80GB PCIe without a bridge reads "NvLink link 0 ... 11 is currently down" from DCGM's health watch)
        unbridged = self.expected.card[s] & ~any_up & (self.expected.links[s] <= 0)
        return np.asarray((ever | (ts - since >= TRAINING_S * S)) & ~unbridged)

    def describe(self, name: str, gpu: GpuView, episode: Episode, ts_ns: int) -> Description:
        if name == NVLINK:
            return self._nvlink(gpu)
        return _pcie(gpu, property_=name == PCIE_NARROW)

    def _nvlink(self, gpu: GpuView) -> Description:
        row, nan = gpu.row, math.nan
        active = row.get("nvlink_links_active", nan)
        expected = float(self.expected.links[gpu.slot]) or row.get("nvlink_links_max", nan)
        pcie = row.get("pcie_tx_bytes_per_second", nan) + row.get("pcie_rx_bytes_per_second", nan)
        nvl = row.get("nvlink_tx_bytes_per_second", nan) + row.get("nvlink_rx_bytes_per_second", nan)
        crc, recovery = gpu.counters["nvlink_crc_errors_total"], gpu.counters["nvlink_recovery_errors_total"]
        what = (
            f"NVLink down: {fmt(active)} of {fmt(expected)} links active, NVLink {fmt(nvl / 1e9, ' GB/s', 1)}, "
            f"PCIe {fmt(pcie / 1e9, ' GB/s', 1)}{self._peers(gpu)} (CRC errors {fmt(crc)}, recoveries "
            f"{fmt(recovery)})"
        )
        action = (
            "drain the GPU's jobs, reset the GPU; if links stay down check the NVLink bridge / NVSwitch tray and "
            "report to support"
        )
        return Description(
            Severity.CRITICAL,
            what,
            action,
            {
                "links_active": active,
                "links_expected": expected,
                "nvlink_bytes_per_second": nvl,
                "pcie_bytes_per_second": pcie,
                "nvlink_crc_errors_total": crc,
                "nvlink_recovery_errors_total": recovery,
            },
        )

    def _peers(self, gpu: GpuView) -> str:
        """Which peers lost their NVLink path to this GPU and what their traffic crosses now (from the topology)."""
        topo = self.topology_of(gpu.cluster, gpu.node)
        if topo is None:
            return ""
        me = next((g for g in topo.gpus if g.uuid == gpu.uuid), None)
        if me is None:
            return ""
        paths: list[str] = []
        for link in topo.links:
            if gpu.uuid not in (link.a, link.b) or not link.kind.startswith("NV"):
                continue
            other_uuid = link.b if link.a == gpu.uuid else link.a
            other = next((g for g in topo.gpus if g.uuid == other_uuid), None)
            if other is None:
                continue
            pcie_kind = next(
                (x.kind for x in topo.links if {x.a, x.b} == {me.uuid, other.uuid} and not x.kind.startswith("NV")),
                None,
            )
            if pcie_kind is None:
                same_numa = me.numa_node is not None and me.numa_node == other.numa_node
                pcie_kind = "NODE" if same_numa else "SYS" if me.numa_node is not None else "PCIe"
            paths.append(f"GPU {other.index} ({pcie_kind})")
        if not paths:
            return ""
        return "; traffic to " + ", ".join(paths) + " now crosses PCIe"


def _pcie(gpu: GpuView, property_: bool = False) -> Description:
    row, nan = gpu.row, math.nan
    gen, gen_max = row.get("pcie_link_gen", nan), row.get("pcie_link_gen_max", nan)
    width, width_max = row.get("pcie_link_width", nan), row.get("pcie_link_width_max", nan)
    share = (2 ** (gen - gen_max)) * width / width_max
    replay = gpu.counters["pcie_replay_total"]
    util = row.get("utilization_gpu_percent", nan)
    if property_:
        what = (
            f"PCIe link narrow since first seen: Gen{fmt(gen)} x{fmt(width)} of Gen{fmt(gen_max)} x{fmt(width_max)} "
            f"({fmt(width / width_max * 100, '%')} of its lanes): how its slot, riser or VM is built, not a fault"
        )
        action = "none if this slot or VM has that many lanes; if it should have them all, check the riser and slot"
        return Description(
            Severity.INFO,
            what,
            action,
            {
                "pcie_width": width,
                "pcie_width_max": width_max,
                "utilization_percent": util,
            },
        )
    busy = f"while busy (util {fmt(util, '%')})" if util > _PCIE_BUSY_UTIL else f"(util {fmt(util, '%')} now)"
    what = (
        f"PCIe link trained at Gen{fmt(gen)} x{fmt(width)} of Gen{fmt(gen_max)} x{fmt(width_max)} {busy} "
        f"({fmt(share * 100, '%')} of its bandwidth), replay counter {fmt(replay)}"
    )
    action = "reseat the GPU and check the riser/slot and its retimer; a link that keeps retraining low needs service"
    return Description(
        Severity.WARNING,
        what,
        action,
        {
            "pcie_gen": gen,
            "pcie_gen_max": gen_max,
            "pcie_width": width,
            "pcie_width_max": width_max,
            "bandwidth_share": share,
            "pcie_replay_total": replay,
            "utilization_percent": row.get("utilization_gpu_percent", nan),
        },
    )
