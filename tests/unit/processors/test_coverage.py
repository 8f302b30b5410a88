"""Which detectors the data cannot feed (processors.coverage): the columns, the sampling interval, jobs, nodes and
events of real logs, on both sides of every rule."""

from __future__ import annotations

import numpy as np

from pipeline import kinds, registry
from pipeline.config import Settings
from processors.coverage import DataShape, blind_detectors
from tests import TESTDATA

NANOGPT = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"
#: what nvidia-smi and dcgm-exporter logs often carry (issue 38)
THREE = ("utilization_gpu_percent", "power_watts", "memory_used_bytes", "memory_total_bytes")
ONE_JOB = DataShape(interval_s=1.0, job_gpus=8, node_gpus=8)


def _blind(columns: tuple[str, ...] | list[str], shape: DataShape) -> dict[str, str]:
    return dict(blind_detectors(columns, shape))


def _every_column() -> list[str]:
    from pipeline.events import METRIC_NAMES

    return list(METRIC_NAMES)


def test_every_detector_is_in_the_table() -> None:
    """Nothing at all: every detector is named, each with a reason; everything, sampled every second, with events
    and a job of 8 GPUs on 8-GPU nodes: none."""
    nothing = _blind([], DataShape(interval_s=None, job_gpus=0, node_gpus=1))
    assert list(nothing) == list(kinds.DETECTORS) and all(nothing.values())
    assert _blind(_every_column(), DataShape(interval_s=1.0, job_gpus=8, node_gpus=8, events=True)) == {}


def test_logs_of_utilization_power_and_memory() -> None:
    """What they can show (a straggler and a whole job's slowdown from utilization and power against the job's
    peers, a leak, a collapse, idle capacity, a cliff, a phase shift, a GPU gone silent) and what they cannot."""
    blind = _blind(THREE, ONE_JOB)
    for detector in (kinds.BRAKE, kinds.THERMAL, kinds.HBM, kinds.POWER, kinds.NVLINK, kinds.PCIE, kinds.XID,
                     kinds.STORM, kinds.ECC, kinds.SBE, kinds.NVLINK_CRC, kinds.PCIE_REPLAY, kinds.REMAP):  # fmt: skip
        assert detector in blind, detector
    assert "throttle_reasons_mask" in blind[kinds.BRAKE]
    assert "XID events" in blind[kinds.XID]
    for detector in (kinds.STRAGGLER, kinds.JOB_SLOWDOWN, kinds.LEAK, kinds.COLLAPSE, kinds.IDLE, kinds.CLIFF,
                     kinds.PHASE_SHIFT, kinds.LOST_BUS):  # fmt: skip
        assert detector not in blind, (detector, blind.get(detector))
    # with the reasons mask and the temperature the clock rules can fire
    assert kinds.BRAKE not in _blind((*THREE, "throttle_reasons_mask"), ONE_JOB)
    assert kinds.THERMAL in _blind((*THREE, "temperature_gpu_celsius"), ONE_JOB)  # no SM clock, no mask
    assert kinds.THERMAL not in _blind((*THREE, "temperature_gpu_celsius", "sm_clock_mhz"), ONE_JOB)


def test_peers_jobs_and_nodes() -> None:
    one_gpu_jobs = _blind(THREE, DataShape(interval_s=1.0, job_gpus=1, node_gpus=8))
    assert "each job has one GPU" in one_gpu_jobs[kinds.STRAGGLER] and kinds.JOB_SLOWDOWN in one_gpu_jobs
    assert kinds.IDLE not in one_gpu_jobs and kinds.COLLAPSE not in one_gpu_jobs  # a job is named
    no_job = _blind(THREE, DataShape(interval_s=1.0, job_gpus=0, node_gpus=8))
    assert {kinds.IDLE, kinds.CLIFF, kinds.COLLAPSE, kinds.PHASE_SHIFT, kinds.STRAGGLER} <= set(no_job)
    unknown = _blind(THREE, DataShape(interval_s=1.0, job_gpus=None, node_gpus=8))  # several jobs: not claimed
    assert kinds.STRAGGLER not in unknown and kinds.IDLE not in unknown
    assert "one GPU" in _blind(THREE, DataShape(interval_s=1.0, job_gpus=8, node_gpus=1))[kinds.LOST_BUS]


def test_sampling_interval() -> None:
    """A leak is judged on per-minute means (and 10-s means for fast ones): at 10 s it is whole, at 30 s only slow
    leaks are seen, past a minute none; single samples feed nothing that needs time."""
    assert kinds.LEAK not in _blind(THREE, DataShape(10.0, 8, 8))
    assert "fast leaks" in _blind(THREE, DataShape(30.0, 8, 8))[kinds.LEAK]
    assert "fast leaks" in _blind(THREE, DataShape(60.0, 8, 8))[kinds.LEAK]
    assert "a sample a minute" in _blind(THREE, DataShape(120.0, 8, 8))[kinds.LEAK]
    single = _blind(THREE, DataShape(None, 8, 8))
    assert {kinds.LEAK, kinds.STRAGGLER, kinds.LOST_BUS, kinds.CLIFF} <= set(single)
    assert all("single samples" in single[d] for d in (kinds.STRAGGLER, kinds.LOST_BUS, kinds.CLIFF))


def test_the_real_nanogpt_log() -> None:
    """nanoGPT PR #643's nvidia-smi log (utilization, power, temperature every 0.33 s, one job of 8 GPUs on one
    node): its straggler, slowdown and silence rules can fire; nothing of memory, clocks, links or errors can."""
    importer = registry.create(
        "importer", "table", Settings(cluster="real"), paths=(NANOGPT / "gpu_metrics_f4f827dd.csv",),
        mapping=NANOGPT / "mapping.toml",
    )  # fmt: skip
    importer.open()
    try:
        columns = {k for b in importer.blocks() for k, v in b.rows.metrics.items() if (~np.isnan(v)).any()}
    finally:
        importer.close()
    assert columns == {"utilization_gpu_percent", "power_watts", "temperature_gpu_celsius"}
    blind = _blind(sorted(columns), DataShape(interval_s=0.331, job_gpus=8, node_gpus=8))
    assert {kinds.STRAGGLER, kinds.JOB_SLOWDOWN, kinds.LOST_BUS, kinds.IDLE, kinds.CLIFF} & set(blind) == set()
    assert {kinds.LEAK, kinds.COLLAPSE, kinds.BRAKE, kinds.THERMAL, kinds.NVLINK, kinds.XID} <= set(blind)
    assert "memory used" in blind[kinds.LEAK]
