"""The link probe's CPU path: timing, fitting, the split of overhead from latency, the host-staged copy, and what a
run reports. The CUDA path needs a GPU and cuda-python (not in CI, and not run on hardware: no GPU was lent)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipeline.topology import TopologyLink
from producers.linkprobe import SIZES, HostCopier, Reading, fit, measure, probe, time_copies, topology_kind


class WireCopier:
    """A copy whose duration is a known line, on a clock that only the copy advances: what the probe must find."""

    path = "d2d"
    kind = "pcie"

    def __init__(self, overhead_s: float, latency_s: float, bytes_per_second: float) -> None:
        self.a, self.b = "G0", "G1"
        self.overhead_s, self.latency_s, self.bps = overhead_s, latency_s, bytes_per_second
        self.now_ns = 0
        self.closed = False

    def clock(self) -> int:
        return self.now_ns

    def copy(self, nbytes: int) -> None:
        took = self.overhead_s + (self.latency_s + nbytes / self.bps if nbytes else 0.0)
        self.now_ns += round(took * 1e9)

    def close(self) -> None:
        self.closed = True


def test_sizes_run_from_4_kib_to_64_mib() -> None:
    assert SIZES[0] == 4096 and SIZES[-1] == 64 * 2**20 and all(b == 4 * a for a, b in itertools.pairwise(SIZES))


def test_fit_recovers_the_line_it_is_given() -> None:
    rng = np.random.default_rng(1)
    for bps, intercept in ((9.5e9, 22e-6), (300e9, 4e-6), (1e9, 1e-3)):
        readings = [Reading(n, intercept + n / bps, 0, 0, 1) for n in SIZES]
        got_bps, got_intercept = fit(readings)
        assert got_bps == pytest.approx(bps, rel=1e-6) and got_intercept == pytest.approx(intercept, rel=1e-6)
        # 2% noise on every reading moves neither figure by more than a few percent
        noisy = [Reading(r.nbytes, r.median_s * (1 + rng.normal(0, 0.02)), 0, 0, 1) for r in readings]
        got_bps, got_intercept = fit(noisy)
        assert got_bps == pytest.approx(bps, rel=0.1) and got_intercept == pytest.approx(intercept, rel=0.1)
    with pytest.raises(ValueError):
        fit(readings[:1])


def test_measure_tells_overhead_from_latency() -> None:
    copier = WireCopier(overhead_s=6e-6, latency_s=16e-6, bytes_per_second=9.5e9)
    timings = time_copies(copier.copy, SIZES, repeats=5, clock=copier.clock)
    assert [r.nbytes for r in timings] == list(SIZES) and timings[0].p10_s <= timings[0].median_s <= timings[0].p90_s
    t = measure(copier, SIZES, 5, clock=copier.clock)
    assert t.overhead_s == pytest.approx(6e-6, rel=1e-3) and t.latency_s == pytest.approx(16e-6, rel=1e-2)
    assert t.bytes_per_second == pytest.approx(9.5e9, rel=1e-3)
    assert (t.a, t.b, t.path, t.kind, t.sizes) == ("G0", "G1", "d2d", "pcie", len(SIZES))


def test_the_host_staged_copy_moves_the_bytes_and_is_timed() -> None:
    copier = HostCopier(max_bytes=1 << 20)
    copier._src[:] = np.arange(1 << 20) % 251
    copier.copy(1000)
    assert np.array_equal(copier._dst[:1000], copier._src[:1000])
    readings = time_copies(copier.copy, (4096, 1 << 20), repeats=5)
    assert all(r.median_s > 0 for r in readings) and readings[1].median_s > readings[0].median_s


def test_a_probe_run_reports_its_timings_and_its_own_cost() -> None:
    copier = HostCopier(max_bytes=SIZES[3])
    run = probe([copier], SIZES[:4], repeats=5, source="test")
    (t,) = run.timings
    assert (t.path, t.kind, t.sizes, t.source) == ("host", "host", 4, "test")
    assert t.bytes_per_second > 1e8 and t.overhead_s > 0 and t.latency_s >= 0
    assert run.cpu_s > 0 and run.wall_s > 0 and copier._src.size == 0  # closed after it was measured


def test_a_pair_takes_its_link_kind_from_the_topology() -> None:
    links = [TopologyLink("G0", "G1", "NV12", 12), TopologyLink("G0", "G2", "SYS"), TopologyLink("G1", "G2", "PIX")]
    assert topology_kind(links, "G1", "G0") == "nvlink"
    assert topology_kind(links, "G2", "G0") == "sys"
    assert topology_kind(links, "G1", "G2") == "pcie"
    assert topology_kind(links, "G0", "G9") == "pcie"


def test_cuda_results_are_checked_whatever_form_the_error_takes() -> None:
    """cuda-python answers (error, value...); the error an enum member or a plain int, depending on the version."""
    import enum

    from producers.linkprobe import _ok

    class Err(enum.Enum):
        cudaSuccess = 0
        cudaErrorInvalidValue = 1

    assert _ok((Err.cudaSuccess, 7)) == 7 and _ok((0,)) == () and _ok((0, 1, 2)) == (1, 2)
    with pytest.raises(RuntimeError, match="CUDA error"):
        _ok((Err.cudaErrorInvalidValue, 7))
    with pytest.raises(RuntimeError):
        _ok((1,))
