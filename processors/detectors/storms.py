"""Error-rate storms: a GPU's correctable error counters rising faster than the rate NVIDIA's DCGM calls harmful.

Corrected errors are the ones a GPU survives, so the state-based checks never see them: DCGM #313 reported a GPU
leaking 17,700 correctable ECC errors a second as "Healthy". Each counter's rise is summed per GPU over windows
of ``WINDOW_S`` (60 s of data time); a window whose mean rate reaches the limit starts the finding, and two windows
in a row below it clear it (one quiet minute inside a storm is not its end). The limits are DCGM's
(``dcgm_gpu_hardware_limits.h``, which its health watches read):

- ``nvlink-crc-storm``: NVLink CRC errors at 100 per second or more ("RM has informed us that CRC errors only
  matter at rates of 100+ per second", ``DCGM_LIMIT_MAX_LWLINK_CRC_ERROR``): a marginal link, retrained and resent
  over and over; inspect the NVLink / NVSwitch path;
- ``pcie-replay-storm``: PCIe replays at 8 per minute or more ("the maximum recommended by RM",
  ``DCGM_LIMIT_MAX_PCIREPLAY_RATE``): a marginal slot, riser or cable; reseat it. Not on a GPU whose link is
  trained below its maximum now (``pcie-link-degraded``'s condition, or its finding open): a link retrains to a
  lower rate or width when it cannot hold its own (the PCIe Base Specification's LTSSM, entered on repeated link
  errors), and the replays are the same marginal signal path seen at the data link layer; one cause, one remedy
  (reseat, check the riser), so one finding, the link's, which names its replay counter. A storm that opened
  first stays open; one on a link at full width is a storm as before;
- ``ecc-sbe-storm``: corrected (single-bit) ECC errors at 10 per second or more (``DCGM_LIMIT_MAX_SBE_RATE`` is 10,
  which DCGM itself marks a placeholder, DCGM-445; read here per second): memory wearing out, the forerunner of
  uncorrectable errors and row remaps (XID 92, "high single-bit ECC error rate"); plan the GPU's replacement;
- ``pcie-aer-storm``: PCIe AER correctable errors of the GPU's link (its own and its upstream port's,
  producers/nvml/aer.py) at 8 per minute or more. DCGM has no AER limit; the correctable errors AER counts (Receiver
  Error, Bad TLP, Bad DLLP, REPLAY_NUM Rollover, Replay Timer Timeout) are the link-layer events that cause replays
  or are replays, so DCGM's replay limit (``DCGM_LIMIT_MAX_PCIREPLAY_RATE``) is the one taken. It sees what the GPU's
  own replay counter may not: errors counted at the link partner (the kernel's AER ABI document). Any rise of the
  *uncorrectable* (nonfatal + fatal) AER count in a window is a storm whatever the rate: an uncorrectable error is a
  lost or corrupted transaction (PCIe Base Specification, 6.2.2), and no rate of them is harmless; it is evidence of
  its own in the finding. Degraded, not unhealthy: a nonfatal error leaves the link up, and a fatal one that takes
  the GPU off the bus is ``fallen-off-bus``'s (unhealthy) to tell.

Per GPU, vectorized over the rows of a batch; every window is judged on data time, so a replay finds what a live
stream finds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline.events import Finding, Severity
from pipeline.kinds import NVLINK_CRC, PCIE, PCIE_AER, PCIE_REPLAY, SBE
from processors.detectors.columns import fmt
from processors.detectors.findings import Reporter
from processors.detectors.gpus import COUNTER, GpuView
from processors.episodes import Description, Episode
from processors.state import GpuSlots, column

WINDOW_S: Final = 60.0
#: quiet windows in a row that clear a storm
_CLEAR: Final = 2


@dataclass(frozen=True, slots=True)
class Storm:
    name: str
    counter: str
    #: per second
    limit: float
    what: str
    action: str
    #: a counter any rise of which is a storm of its own whatever the rate (the same link's uncorrectable errors)
    severe: str | None = None


STORMS: Final = (
    Storm(NVLINK_CRC, "nvlink_crc_errors_total", 100.0, "NVLink CRC errors",
          "a marginal NVLink: inspect the link and its NVSwitch path (reseat the board or cable); drain if it grows"),
    Storm(PCIE_REPLAY, "pcie_replay_total", 8 / 60, "PCIe replays",
          "a marginal PCIe link: reseat the GPU, check the riser and the slot; it slows every transfer"),
    Storm(SBE, "ecc_corrected_total", 10.0, "corrected (single-bit) ECC errors",
          "memory wearing out: plan the GPU's replacement before uncorrectable errors come (XID 92)"),
    Storm(PCIE_AER, "pcie_aer_correctable_total", 8 / 60, "PCIe AER correctable errors (GPU and upstream port)",
          "a marginal PCIe link, seen at either end: reseat the GPU, check the riser, cable and slot; the GPU's own "
          "replay counter may show nothing", severe="pcie_aer_uncorrectable_total"),
)  # fmt: skip
_COLS: Final = [COUNTER[s.counter] for s in STORMS]
_LIMITS: Final = np.array([s.limit for s in STORMS])
#: (storm, counter column) of the storms with a severe counter
_SEVERE: Final = [(k, COUNTER[s.severe]) for k, s in enumerate(STORMS) if s.severe is not None]
#: the storm a degraded PCIe link holds (module docstring)
_REPLAY: Final = [s.name for s in STORMS].index(PCIE_REPLAY)


@dataclass(eq=False)
class _Windows:
    """Per GPU: the window being summed (its rises per storm and seconds covered), the last window's rates, and how
    many windows in a row each open storm has been below its limit."""

    sums: np.ndarray = column(0.0, len(STORMS))
    #: the rises of each storm's severe counter in the window being summed, and in the last one
    severe: np.ndarray = column(0.0, len(STORMS))
    severe_last: np.ndarray = column(0.0, len(STORMS))
    seconds: np.ndarray = column(0.0)
    rate: np.ndarray = column(np.nan, len(STORMS))
    quiet: np.ndarray = column(0, len(STORMS), dtype=np.int64)


class Storms:
    """The error-storm findings (module docstring)."""

    names = tuple(s.name for s in STORMS)

    def __init__(self, slots: GpuSlots, report: Reporter) -> None:
        self.report = report
        self.windows = slots.attach(_Windows())

    def step(
        self,
        g: np.ndarray,
        ts: np.ndarray,
        deltas: np.ndarray,
        dt_s: np.ndarray,
        out: list[Finding],
        link_degraded: np.ndarray | None = None,
    ) -> None:
        """One row per GPU ``g``: its counters' rises since its previous row (gpus.Latest.counter_deltas) over
        ``dt_s`` seconds; a GPU whose window is full is judged. ``link_degraded``: per row, whether the GPU's PCIe
        link is trained below its maximum now (links.conditions); a replay storm does not open on such a link."""
        w = self.windows
        w.sums[g] += deltas[:, _COLS]
        for k, col in _SEVERE:
            w.severe[g, k] += deltas[:, col]
        w.seconds[g] += dt_s
        full = w.seconds[g] >= WINDOW_S
        if not full.any():
            return
        gf, tf = g[full], ts[full]
        rate = w.sums[gf] / w.seconds[gf][:, None]
        severe = w.severe[gf]
        w.rate[gf], w.severe_last[gf] = rate, severe
        w.sums[gf], w.severe[gf], w.seconds[gf] = 0.0, 0.0, 0.0
        over = (rate >= _LIMITS) | (severe > 0)
        gpus = self.report.gpus
        held = gpus.active(gf, PCIE)
        if link_degraded is not None:
            held |= link_degraded[full]
        for k, storm in enumerate(STORMS):
            open_ = gpus.active(gf, storm.name)
            w.quiet[gf[over[:, k]], k] = 0
            w.quiet[gf[open_ & ~over[:, k]], k] += 1
            for i in np.flatnonzero(open_ & over[:, k]).tolist():
                detail = gpus.get(int(gf[i]), storm.name).detail
                detail["peak_per_s"] = max(detail.get("peak_per_s", 0.0), float(rate[i, k]))
                detail["severe"] = detail.get("severe", 0.0) + float(severe[i, k])
            opens = over[:, k] & ~open_
            if k == _REPLAY:
                opens &= ~held
            for i in np.flatnonzero(opens).tolist():
                start = {"peak_per_s": float(rate[i, k]), "severe": float(severe[i, k])}
                self.report.transition(int(gf[i]), storm.name, True, int(tf[i]), out, start)
            for i in np.flatnonzero(open_ & (w.quiet[gf, k] >= _CLEAR)).tolist():
                self.report.transition(int(gf[i]), storm.name, False, int(tf[i]), out)
                w.quiet[gf[i], k] = 0

    def describe(self, name: str, gpu: GpuView, episode: Episode, ts_ns: int) -> Description:
        k = self.names.index(name)
        storm = STORMS[k]
        rate, peak = float(self.windows.rate[gpu.slot, k]), episode.detail.get("peak_per_s", float("nan"))
        unit, scale = ("/min", 60.0) if storm.limit < 1 else ("/s", 1.0)
        total = gpu.counters.get(storm.counter, float("nan"))
        what = (
            f"{storm.what} at {fmt(rate * scale, unit, 1)} over the last {WINDOW_S:.0f} s (peak "
            f"{fmt(peak * scale, unit, 1)}; DCGM's limit {storm.limit * scale:g}{unit}), {fmt(total)} in total"
        )
        evidence = {
            "rate_per_s": rate,
            "peak_per_s": peak,
            "limit_per_s": storm.limit,
            "window_s": WINDOW_S,
            "total": total,
        }
        if storm.severe is not None:
            severe = episode.detail.get("severe", 0.0)
            severe_total = gpu.counters.get(storm.severe, float("nan"))
            last = float(self.windows.severe_last[gpu.slot, k])
            evidence |= {
                "uncorrectable": severe,
                "uncorrectable_last_window": last,
                "uncorrectable_total": severe_total,
            }
            if severe > 0:
                what += f"; {fmt(severe)} uncorrectable (nonfatal or fatal) since it began, {fmt(severe_total)} in all"
        return Description(Severity.WARNING, what, storm.action, evidence)
