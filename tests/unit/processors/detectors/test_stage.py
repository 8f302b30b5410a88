"""The detectors on hand-built batches shaped like each fault's physical signature, and on healthy behaviour
that looks alarming but is normal (idle PCIe downshift, checkpoint dips, KV-cache growth, an operator's cap)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pynvml
import pytest

from pipeline.config import DetectorSettings
from pipeline.events import (
    EventKind,
    Finding,
    GpuEvent,
    GpuProcess,
    GpuSample,
    InterpretedBatch,
    InterpretedEvent,
    NodeTopology,
    NvLinkSample,
    TopologyGpu,
    TopologyLink,
    Workload,
    metric_matrix,
)
from processors.detectors.memory import fast_leak
from processors.detectors.stage import Detectors
from processors.normalize import relative_values

S = 1_000_000_000
T0 = 1_700_000_000 * S
MODEL = "NVIDIA H100 80GB HBM3"
GIB = 2**30
HW_THERMAL = pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
SW_POWER_CAP = pynvml.nvmlClocksThrottleReasonSwPowerCap


def healthy(t: int, gpu: int, rng: np.random.Generator) -> dict[str, float]:
    """A busy H100 of an LLM pre-training job, with a little noise."""
    return {
        "utilization_gpu_percent": float(np.clip(96 + rng.normal(0, 1.5), 0, 100)),
        "memory_used_bytes": float(round(56 * GIB * (1 + rng.normal(0, 0.002)))),
        "memory_total_bytes": 80.0 * GIB,
        "sm_clock_mhz": float(round(1830 + rng.normal(0, 8))),
        "sm_clock_max_mhz": 1980.0,
        "temperature_gpu_celsius": float(round(68 + rng.normal(0, 0.7))),
        "temperature_slowdown_celsius": 90.0,
        "temperature_shutdown_celsius": 92.0,
        "power_watts": float(610 + rng.normal(0, 10)),
        "power_limit_watts": 700.0,
        "power_default_limit_watts": 700.0,
        "throttle_reasons_mask": 0.0,
        "pcie_link_gen": 5.0,
        "pcie_link_gen_max": 5.0,
        "pcie_link_width": 16.0,
        "pcie_link_width_max": 16.0,
        "pcie_tx_bytes_per_second": 2e9,
        "pcie_rx_bytes_per_second": 2e9,
        "nvlink_tx_bytes_per_second": 120e9,
        "nvlink_rx_bytes_per_second": 120e9,
        "nvlink_links_active": 18.0,
        "nvlink_links_max": 18.0,
        "nvlink_crc_errors_total": 3.0,
        "nvlink_recovery_errors_total": 0.0,
        "ecc_uncorrected_total": 0.0,
        "row_remap_uncorrectable_total": 0.0,
        "row_remap_pending": 0.0,
        "row_remap_failure": 0.0,
        "pcie_replay_total": 10.0,
    }


Shape = Callable[[int, int, dict[str, float]], dict[str, float] | None]
Job = Callable[[int, int], Workload | None]


def pretraining(_t: int, _gpu: int) -> Workload:
    return Workload("llm-pretraining", job_id="job-7", source="simulator", confidence=1.0, job_gpus=8)


def run(
    seconds: int,
    shape: Shape | None = None,
    job: Job = pretraining,
    gpus: int = 8,
    events: Callable[[int], list[GpuEvent]] | None = None,
    rounds_per_batch: int = 1,
    detectors: Detectors | None = None,
    start: int = 0,
    seed: int = 0,
    processes: Callable[[int, int], tuple[GpuProcess, ...] | None] | None = None,
) -> tuple[Detectors, list[Finding], list[InterpretedBatch]]:
    """Feed ``seconds`` rounds of one node (``gpus`` GPUs at 1 Hz) through the detectors.

    ``shape(t, gpu, metrics)`` rewrites a healthy reading (None: the GPU sends no sample that round);
    ``processes(t, gpu)`` gives the GPU's process list (default: not reported).
    """
    det = detectors or Detectors(DetectorSettings())
    rng = np.random.default_rng(seed)
    found: list[Finding] = []
    out: list[InterpretedBatch] = []
    pending: list[InterpretedEvent] = []
    pending_events: list[GpuEvent] = []
    for t in range(start, start + seconds):
        ts = T0 + t * S
        for gpu in range(gpus):
            metrics = healthy(t, gpu, rng)
            if shape is not None:
                shaped = shape(t, gpu, metrics)
                if shaped is None:
                    continue
                metrics = shaped
            procs = processes(t, gpu) if processes is not None else None
            sample = GpuSample("c1", "node-1", f"GPU-{gpu}", gpu, MODEL, ts, metrics, processes=procs)
            pending.append(InterpretedEvent(sample, workload=job(t, gpu)))
        pending_events.extend(events(t) if events else [])
        if (t - start + 1) % rounds_per_batch == 0 or t == start + seconds - 1:
            batch = _batch(pending, tuple(pending_events))
            batch, findings = det.apply(batch, ts)
            found.extend(findings)
            found.extend(det.tick(ts))
            out.append(batch)
            pending, pending_events = [], []
    return det, found, out


def _batch(events: list[InterpretedEvent], gpu_events: tuple[GpuEvent, ...]) -> InterpretedBatch:
    b = InterpretedBatch.from_events(events, gpu_events)
    return replace(b, relative=relative_values(metric_matrix([e.sample for e in events])))


def starts(found: list[Finding], detector: str | None = None) -> list[Finding]:
    return [f for f in found if f.active and f.ts_ns == f.since_ns and (detector is None or f.detector == detector)]


def kinds(found: list[Finding]) -> set[tuple[str, str | None]]:
    return {(f.detector, f.gpu_uuid) for f in starts(found)}


# --------------------------------------------------------------------------------------- healthy behaviour
def test_healthy_busy_node_raises_nothing() -> None:
    _det, found, _ = run(1800)
    assert found == []


def test_checkpoint_dips_idle_downshift_and_idle_gpus_are_normal() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu >= 6:  # idle GPUs: gen 1 at idle is normal, the width stays
            m |= {
                "utilization_gpu_percent": 0.0,
                "pcie_link_gen": 1.0,
                "sm_clock_mhz": 345.0,
                "power_watts": 70.0,
                "memory_used_bytes": 0.5 * GIB,
                "nvlink_tx_bytes_per_second": 0.0,
                "throttle_reasons_mask": 1.0,
            }
        elif t % 600 < 45:  # a checkpoint every 10 min: util collapses, the link downshifts, PCIe bursts
            m |= {
                "utilization_gpu_percent": 3.0,
                "pcie_link_gen": 2.0,
                "pcie_tx_bytes_per_second": 20e9,
                "sm_clock_mhz": 600.0,
            }
        return m  # fmt: skip

    def job(_t: int, gpu: int) -> Workload | None:
        return pretraining(_t, gpu) if gpu < 6 else None

    _det, found, _ = run(3600, shape, job)
    assert found == []


def test_kv_cache_growth_that_plateaus_is_not_a_leak() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        fill = 0.2 + 0.7 * (1 - np.exp(-t / 800))  # KV cache fills (time constant 13 min), then plateaus at 90%
        return m | {"memory_used_bytes": float(round(80 * GIB * fill)), "utilization_gpu_percent": 60.0}

    def serving(_t: int, _gpu: int) -> Workload:
        return Workload("llm-serving", job_id="serve-1", source="simulator", job_gpus=1)

    _det, found, _ = run(3600, shape, serving, gpus=2)
    assert found == []


def test_job_start_memory_ramp_is_not_a_leak() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | {"memory_used_bytes": float(round(80 * GIB * min(0.75, 0.01 + t / 120 * 0.75)))}

    _det, found, _ = run(2400, shape, gpus=2)
    assert found == []


@pytest.mark.parametrize("tau_s", [120, 300, 500, 600, 800])
def test_a_cache_filling_towards_a_plateau_is_not_a_fast_leak(tau_s: int) -> None:
    """KV caches (TGI grows its cache with traffic, time constant ~10 min) fill fast at first, then slow down:
    the time constants below ~10 min slow down within the 2-minute window, the longer ones project to full in
    more than 10 minutes."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        fill = 0.9 - 0.7 * np.exp(-t / tau_s) + noise.normal(0, 0.001)
        return m | {"memory_used_bytes": float(round(80 * GIB * fill)), "utilization_gpu_percent": 60.0}

    def serving(_t: int, _gpu: int) -> Workload:
        return Workload("llm-serving", job_id="serve-1", source="simulator", job_gpus=1)

    noise = np.random.default_rng(tau_s)
    _det, found, _ = run(1800, shape, serving, gpus=2)
    assert found == []


def test_eval_phase_allocations_and_a_restarted_job_are_not_leaks() -> None:
    """Every 10 minutes an eval phase allocates 10% of the memory within 40 s and frees it after 2 minutes; at
    t=1500 the job is restarted (new pid) and ramps up again within a minute."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        used = 0.5
        phase = t % 600
        if 300 <= phase < 460:
            used += 0.1 * min(1.0, (phase - 300) / 40)
        if t >= 1500:
            used = 0.5 * min(1.0, (t - 1500 + 1) / 50)
        return m | {"memory_used_bytes": float(round(80 * GIB * max(used, 0.004)))}

    def processes(t: int, gpu: int) -> tuple[GpuProcess, ...]:
        return (GpuProcess(4000 + gpu + (100 if t >= 1500 else 0), "python", None),)

    _det, found, _ = run(2400, shape, gpus=2, processes=processes)
    assert found == []


def test_operator_power_cap_at_job_start_is_a_setting() -> None:
    def job(t: int, gpu: int) -> Workload | None:
        return None if t < 300 else Workload("bert-training", job_id="job-9", source="simulator", job_gpus=2)

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if t < 300:
            return m | {"utilization_gpu_percent": 0.0, "power_watts": 70.0, "pcie_link_gen": 1.0}
        # the operator caps at 450 W when the job starts (the limit lands a few seconds before the context)
        cap = 450.0 if t >= 295 else 700.0
        return m | {"power_limit_watts": cap, "power_watts": 440.0, "throttle_reasons_mask": float(SW_POWER_CAP)}

    _det, found, _ = run(1200, shape, job, gpus=2)
    assert found == []


def test_a_gpu_capped_when_first_seen_is_a_setting() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | {"power_limit_watts": 400.0, "power_watts": 395.0, "throttle_reasons_mask": float(SW_POWER_CAP)}

    _det, found, _ = run(600, shape, gpus=2)
    assert found == []


def _miner(t: int, gpu: int, m: dict[str, float], start: int, limit_at: int) -> dict[str, float]:
    """A GTX 1080 Ti: idle until a miner's process starts at ``start``; its limit is lowered at ``limit_at``."""
    m |= {"memory_total_bytes": 11.0 * GIB, "power_default_limit_watts": 250.0, "sm_clock_max_mhz": 1911.0,
          "power_limit_watts": 173.0 if t >= limit_at else 250.0, "pcie_link_gen_max": 3.0, "pcie_link_gen": 3.0,
          "process_count": 1.0 if t >= start else 0.0}  # fmt: skip
    for name in ("nvlink_links_active", "nvlink_links_max", "nvlink_tx_bytes_per_second",
                 "nvlink_rx_bytes_per_second", "nvlink_crc_errors_total", "nvlink_recovery_errors_total"):  # fmt: skip
        del m[name]
    if t < start:
        return m | {"utilization_gpu_percent": 0.0, "power_watts": 12.0, "memory_used_bytes": 3.0 * 2**20,
                    "sm_clock_mhz": 139.0, "pcie_link_gen": 1.0}  # fmt: skip
    return m | {"utilization_gpu_percent": 100.0, "power_watts": 170.0, "memory_used_bytes": 2.5 * GIB,
                "sm_clock_mhz": 1480.0, "throttle_reasons_mask": float(SW_POWER_CAP)}  # fmt: skip


@pytest.mark.parametrize(("with_processes", "limit_at"), [(True, 600), (False, 600), (True, 590), (False, 640)])
def test_a_miner_lowering_its_limit_at_its_start_is_a_setting_without_context(with_processes: bool,
                                                                               limit_at: int) -> None:  # fmt: skip
    """The evaluation's power-capping false alarms: no context source, and a hashing job lowers the GPU's limit
    when its process starts (the same second, or a little before or after it). The new process is the job
    boundary the telemetry shows by itself (a new pid; without a process list, the process count)."""

    def processes(t: int, gpu: int) -> tuple[GpuProcess, ...] | None:
        if not with_processes:
            return None
        return (GpuProcess(3207845 + gpu, "t-rex", int(2.5 * GIB)),) if t >= 600 else ()

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return _miner(t, gpu, m, 600, limit_at)

    _det, found, _ = run(1200, shape, job=lambda _t, _g: None, gpus=2, processes=processes)
    assert found == []


def test_a_limit_lowered_mid_job_without_context_is_still_a_fault() -> None:
    """The same GPU, the miner running for 10 minutes with the same process when its limit drops: a fault."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return _miner(t, gpu, m, 0, 600)

    def processes(t: int, gpu: int) -> tuple[GpuProcess, ...]:
        return (GpuProcess(3207845, "t-rex", int(2.5 * GIB)),)

    _det, found, _ = run(1000, shape, job=lambda _t, _g: None, gpus=1, processes=processes)
    assert kinds(found) == {("power-capping", "GPU-0")}
    assert starts(found)[0].ts_ns == T0 + 720 * S


# ---------------------------------------------------------------------------------------------- faults
def test_power_supply_failure_is_one_node_level_finding() -> None:
    """Every GPU of the node is lowered to 50% mid-job at once (a failed PSU): one finding for the node (gpu_uuid
    None) naming the GPUs, not eight; every GPU's rows are explained by it and none of them is a straggler."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if 400 <= t < 1400 and not (gpu == 7 and t < 403):  # GPU 7's limit lands 3 s later
            m |= {"power_limit_watts": 350.0, "power_watts": 352.0, "sm_clock_mhz": 1150.0 + gpu,
                  "throttle_reasons_mask": float(SW_POWER_CAP)}  # fmt: skip
            if gpu >= 6:  # two GPUs idle: capped as well, but not drawing power
                m |= {"utilization_gpu_percent": 0.0, "power_watts": 80.0, "throttle_reasons_mask": 0.0}
        return m

    def job(t: int, gpu: int) -> Workload | None:
        return pretraining(t, gpu) if gpu < 6 else None

    _det, found, batches = run(1600, shape, job)
    (start,) = starts(found)
    assert (start.detector, start.gpu_uuid, start.node) == ("power-capping", None, "node-1")
    assert start.ts_ns == T0 + 520 * S
    assert "power capping on 8 of 8 GPUs at once (GPU 0, 1, 2, 3, 4, 5, 6, 7)" in start.summary
    assert "to 350 W from 700 W (50% of default)" in start.summary and "6 busy GPUs held" in start.summary
    assert "power supplies" in start.action and start.severity == "warning"
    assert start.evidence["gpus_capped"] == 8 and start.evidence["busy_gpus_capped"] == 6
    (clear,) = [f for f in found if not f.active]
    assert clear.gpu_uuid is None and clear.ts_ns == T0 + 1400 * S and clear.since_ns == start.since_ns
    repeats = [f for f in found if f.active and f.ts_ns > f.since_ns]
    assert repeats and all(f.gpu_uuid is None for f in repeats)
    rows = [(b.gpu_uuid[i], b.ts_ns[i], b.explanation[i]) for b in batches for i in range(len(b))]
    explained = {uuid for uuid, ts, text in rows if "power capping on 8 of 8 GPUs" in text}
    assert explained == {f"GPU-{g}" for g in range(8)}
    assert not [text for _u, ts, text in rows if ts >= T0 + 1400 * S and "power capping" in text]


def test_power_supply_failure_next_to_job_ends_and_starts_without_context() -> None:
    """No context. GPU 3's job ended 40 s before the PSU failed (its process went away): a job's end is no
    setting, GPU 3 is in the node finding. GPU 2's next job starts 30 s after (a new pid): its lower limit is
    taken for that job's setting, a documented limit."""

    def processes(t: int, gpu: int) -> tuple[GpuProcess, ...]:
        if gpu == 3 and t >= 360:
            return ()
        return (GpuProcess(7000 + gpu + (50 if gpu == 2 and t >= 430 else 0), "python", None),)

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if t >= 400:
            m |= {"power_limit_watts": 400.0, "power_watts": 398.0, "throttle_reasons_mask": float(SW_POWER_CAP)}
        if gpu == 3 and t >= 360:
            m |= {"utilization_gpu_percent": 0.0, "power_watts": 70.0, "memory_used_bytes": 0.0}
        return m

    _det, found, _ = run(900, shape, job=lambda _t, _g: None, gpus=4, processes=processes)
    assert [(f.detector, f.gpu_uuid, f.ts_ns) for f in starts(found)] == [("power-capping", None, T0 + 520 * S)]
    assert "on 3 of 4 GPUs at once (GPU 0, 1, 3)" in starts(found)[0].summary


def test_a_job_start_from_processes_counts_from_its_row_on_in_replays_too() -> None:
    """GPU 2's next job starts 10 s after the node's lowered limits were confirmed: live, GPU 2 is in the node
    finding; a replay batch of 37 rounds holding both rows must not see that start early."""

    def processes(t: int, gpu: int) -> tuple[GpuProcess, ...]:
        return (GpuProcess(7000 + gpu + (50 if gpu == 2 and t >= 530 else 0), "python", None),)

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | {"power_limit_watts": 400.0, "power_watts": 398.0} if t >= 400 else m

    found = {}
    for per_batch in (1, 37):
        _det, out, _ = run(700, shape, job=lambda _t, _g: None, gpus=4, processes=processes, rounds_per_batch=per_batch)
        found[per_batch] = [(f.gpu_uuid, f.since_ns, f.summary) for f in starts(out)]
    assert found[1] == found[37]
    assert [(uuid, since) for uuid, since, _ in found[1]] == [(None, T0 + 520 * S)]
    assert "on 4 of 4 GPUs at once" in found[1][0][2]


def test_two_gpus_lowered_seconds_apart_are_one_node_finding_and_one_alone_is_per_gpu() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        lowered = (gpu == 1 and 200 <= t < 900) or (gpu == 4 and 230 <= t < 900) or (gpu == 6 and t >= 1200)
        return m | {"power_limit_watts": 450.0, "power_watts": 445.0} if lowered else m

    _det, found, _ = run(1500, shape)
    assert [(f.gpu_uuid, f.ts_ns) for f in starts(found)] == [(None, T0 + 320 * S), ("GPU-6", T0 + 1320 * S)]
    assert "on 2 of 8 GPUs at once (GPU 1, 4)" in starts(found)[0].summary
    assert [(f.gpu_uuid, f.ts_ns) for f in found if not f.active] == [(None, T0 + 900 * S)]


def test_a_fast_leak_is_found_before_the_process_runs_out_of_memory() -> None:
    """140 MiB/s on an 80 GiB GPU from 40%: the process dies (OOM) ~340 s later; the per-minute trend would need
    9+ minutes. The 2-minute straight line finds it minutes before, names the time to full, and clears at the
    OOM; the restarted process ramping back up is not a leak."""
    rate, total = 140 * 2**20, 80 * GIB
    usable = total - 0.5 * GIB
    oom = 900 + int((0.985 * usable - 0.4 * total) / rate)

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        m["memory_reserved_bytes"] = 0.5 * GIB
        if gpu != 0:
            return m
        if t < oom:
            used = 0.4 * total + max(t - 900, 0) * rate
        else:  # out of memory: the process dies, its supervisor restarts it 20 s later and it ramps up again
            used = 0.3 * GIB if t < oom + 20 else 0.4 * total * (1 - np.exp(-(t - oom - 20) / 15))
        return m | {"memory_used_bytes": float(np.floor(max(used, 0.3 * GIB) / 2**20) * 2**20)}

    _det, found, _ = run(2400, shape, gpus=2)
    (leak,) = starts(found)
    assert (leak.detector, leak.gpu_uuid) == ("memory-leak", "GPU-0")
    assert T0 + 1000 * S <= leak.ts_ns <= T0 + 1100 * S and leak.ts_ns <= T0 + (oom - 200) * S
    assert leak.severity == "critical"
    assert leak.evidence["growth_per_min"] == pytest.approx(rate * 60 / total, rel=0.1)
    minutes_left = (oom * S + T0 - leak.ts_ns) / S / 60
    assert leak.evidence["minutes_to_full"] == pytest.approx(minutes_left, rel=0.2)
    assert "MiB/s" in leak.summary and "full in ~" in leak.summary
    (clear,) = [f for f in found if not f.active]
    assert clear.ts_ns == T0 + oom * S


def test_fast_leak_rule_on_windows() -> None:
    """The pure rule on 2-minute windows of 10-s means: a line is a leak, a plateauing fill, a slow line, a dip,
    a far-off full and a gap are not."""
    x = np.arange(12) * 10.0
    windows = np.array([
        0.4 + x * 0.1 / 60,  # 10%/min: full in ~6 min
        0.4 + np.maximum(x - 10, 0) * 0.1 / 60,  # the same, starting 10 s into the window
        0.9 - 0.5 * np.exp(-(x + 60) / 300),  # a cache filling with a 5-minute time constant
        0.4 + x * 0.005 / 60,  # 0.5%/min: for the slow route
        np.r_[0.4 + x[:6] * 0.1 / 60, 0.4 + x[6:] * 0.1 / 60 - 0.05],  # a drop in the middle
        0.1 + x * 0.02 / 60,  # 2%/min from 10%: full in 45 min
        np.r_[np.nan, 0.4 + x[1:] * 0.1 / 60],  # a missing 10 s
    ])  # fmt: skip
    leaking, slope, to_full = fast_leak(windows, np.full(7, 0.99), 0.01 / 60, 600.0)
    assert leaking.tolist() == [True, True, False, False, False, False, False]
    assert slope[0] * 60 == pytest.approx(0.1) and to_full[0] == pytest.approx((0.99 - 0.4 - 110 * 0.1 / 60) / 0.1 * 60)


# ---------------------------------------------------------------------------------------------- faults (GPU)
def test_thermal_throttling_starts_repeats_clears_and_explains() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu == 3 and 300 <= t < 600:
            return m | {"temperature_gpu_celsius": 89.0, "throttle_reasons_mask": float(HW_THERMAL),
                        "sm_clock_mhz": 1230.0, "power_watts": 480.0, "utilization_gpu_percent": 97.0}  # fmt: skip
        return m

    _det, found, batches = run(900, shape)
    assert kinds(found) == {("thermal-throttling", "GPU-3")}
    first = starts(found)[0]
    assert T0 + 300 * S <= first.ts_ns <= T0 + 315 * S
    assert first.evidence["temperature_c"] == 89.0 and first.evidence["sm_clock_ratio"] == pytest.approx(1230 / 1980)
    assert "GPU 3" in first.summary and "job job-7 (llm-pretraining)" in first.summary and "62%" in first.summary
    assert "cooling" in first.action
    repeats = [f for f in found if f.active and f.ts_ns > f.since_ns]
    assert 3 <= len(repeats) <= 5 and all(f.since_ns == first.since_ns for f in repeats)
    (clear,) = [f for f in found if not f.active]
    assert T0 + 600 * S <= clear.ts_ns <= T0 + 630 * S and clear.dedup_key == first.dedup_key
    explained = [
        e for b in batches for e, u in zip(b.explanation, b.gpu_uuid, strict=True) if "thermal throttling" in e
    ]
    assert explained and all(u for u in explained)


def test_power_capping_mid_job_is_a_fault() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu == 2 and 400 <= t < 1000:
            return m | {"power_limit_watts": 420.0, "power_watts": 415.0, "sm_clock_mhz": 1400.0,
                        "throttle_reasons_mask": float(SW_POWER_CAP)}  # fmt: skip
        return m

    _det, found, _ = run(1200, shape)
    assert kinds(found) == {("power-capping", "GPU-2")}
    first = starts(found)[0]
    assert T0 + 515 * S <= first.ts_ns <= T0 + 530 * S  # confirmed after power_confirm_s (120 s)
    assert first.evidence["power_limit_w"] == 420 and first.evidence["previous_limit_w"] == 700
    assert "420 W from 700 W" in first.summary
    (clear,) = [f for f in found if not f.active]
    assert clear.ts_ns == T0 + 1000 * S


def test_nvlink_down_names_the_peers_and_the_pcie_path() -> None:
    topo = NodeTopology(
        "c1", "node-1", T0,
        tuple(TopologyGpu(f"GPU-{i}", i, MODEL, f"0000:{i:02x}:00.0", numa_node=i // 2, nvlink_links=18)
              for i in range(4)),
        tuple(TopologyLink(f"GPU-{a}", f"GPU-{b}", "NV18", 18) for a in range(4) for b in range(a + 1, 4)),
    )  # fmt: skip

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu == 1 and t >= 200:
            return m | {"nvlink_links_active": 0.0, "nvlink_tx_bytes_per_second": 0.0,
                        "nvlink_rx_bytes_per_second": 0.0, "pcie_tx_bytes_per_second": 24e9,
                        "pcie_rx_bytes_per_second": 24e9, "nvlink_crc_errors_total": 480.0,
                        "nvlink_recovery_errors_total": 12.0}  # fmt: skip
        return m

    det = Detectors(DetectorSettings(), lambda cluster, node: topo if node == "node-1" else None)
    _det, found, _ = run(400, shape, gpus=4, detectors=det)
    assert kinds(found) == {("nvlink-down", "GPU-1")}
    first = starts(found)[0]
    assert first.ts_ns <= T0 + 210 * S
    assert first.evidence["links_active"] == 0 and first.evidence["links_expected"] == 18
    assert first.evidence["pcie_bytes_per_second"] == 48e9
    assert "GPU 0 (NODE), GPU 2 (SYS), GPU 3 (SYS) now crosses PCIe" in first.summary


def test_a_finding_describes_the_row_it_started_on() -> None:
    """After a gap in the data (a collector restart, a replay), a fault can be confirmed on its first row: the
    summary must quote that row, not the healthy one before the gap."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float] | None:
        if 100 <= t < 160:
            return None  # nothing reported for a minute
        if gpu == 1 and t >= 160:
            return m | {"nvlink_links_active": 0.0, "nvlink_tx_bytes_per_second": 0.0,
                        "nvlink_rx_bytes_per_second": 0.0, "pcie_tx_bytes_per_second": 24e9,
                        "pcie_rx_bytes_per_second": 24e9}  # fmt: skip
        return m

    _det, found, _ = run(200, shape, gpus=2)
    first = next(f for f in starts(found) if f.detector == "nvlink-down")
    assert "0 of 18 links active" in first.summary, first.summary
    assert first.evidence["links_active"] == 0


def test_nvlink_from_per_link_samples_when_totals_are_missing() -> None:
    det = Detectors(DetectorSettings())
    rng = np.random.default_rng(0)
    found = []
    for t in range(60):
        events = []
        for gpu in range(2):
            m = healthy(t, gpu, rng)
            del m["nvlink_links_active"], m["nvlink_links_max"]
            links = tuple(NvLinkSample(k, not (gpu == 1 and t >= 20 and k < 4)) for k in range(18))
            sample = GpuSample("c1", "node-1", f"GPU-{gpu}", gpu, MODEL, T0 + t * S, m, links=links)
            events.append(InterpretedEvent(sample, workload=pretraining(t, gpu)))
        found += det.apply(_batch(events, ()), T0)[1]
    assert kinds(found) == {("nvlink-down", "GPU-1")}
    assert starts(found)[0].evidence["links_active"] == 14


def test_nvlink_without_topology_uses_the_samples_own_link_count() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | {"nvlink_links_active": 12.0} if gpu == 0 and t >= 100 else m

    _det, found, _ = run(200, shape, gpus=2)
    assert kinds(found) == {("nvlink-down", "GPU-0")}
    assert starts(found)[0].evidence["links_expected"] == 18


def test_pcie_link_trained_narrow_while_busy() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu == 4 and t >= 100:
            return m | {"pcie_link_width": 8.0, "pcie_link_gen": 4.0, "pcie_replay_total": 10.0 + (t - 100) * 5}
        return m

    _det, found, _ = run(400, shape)
    assert kinds(found) == {("pcie-link-degraded", "GPU-4")}
    first = starts(found)[0]
    assert first.evidence["pcie_width"] == 8 and first.evidence["bandwidth_share"] == pytest.approx(0.25)
    assert "Gen4 x8 of Gen5 x16" in first.summary


def test_memory_leak_is_found_and_named() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu == 0 and t >= 900:
            used = min(0.99, 0.3 + (t - 900) / 60 * 0.01 + noise.normal(0, 0.01))  # +1% of memory per minute
            return m | {"memory_used_bytes": float(round(80 * GIB * used))}
        return m | {"memory_used_bytes": 24.0 * GIB} if gpu == 0 else m

    noise = np.random.default_rng(5)
    _det, found, _ = run(3000, shape, gpus=2)
    assert kinds(found) == {("memory-leak", "GPU-0")}
    first = starts(found)[0]
    # the long trend has to forget the flat past before the trends agree, then 300 s of confirmation
    assert T0 + 1200 * S <= first.ts_ns <= T0 + 1800 * S
    assert first.evidence["growth_per_min"] == pytest.approx(0.01, rel=0.25)


def test_straggler_in_an_eight_gpu_job() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if t < 900:
            return m
        if gpu == 5:  # slower: lower clock, lower duty cycle
            return m | {"sm_clock_mhz": 1400.0, "utilization_gpu_percent": 88.0}
        # the peers wait for it at every all-reduce: periodic util dips
        return m | {"utilization_gpu_percent": 35.0 if t % 10 < 3 else 97.0}

    _det, found, _ = run(1800, shape)
    assert kinds(found) == {("straggler", "GPU-5")}
    first = starts(found)[0]
    assert T0 + 900 * S < first.ts_ns <= T0 + 1200 * S
    assert first.evidence["slower_than_median"] > 0.2 and first.evidence["peers"] == 8


def _slow_gpu_5(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
    if t < 900:
        return m
    if gpu == 5:
        return m | {"sm_clock_mhz": 1400.0, "utilization_gpu_percent": 88.0}
    return m | {"utilization_gpu_percent": 35.0 if t % 10 < 3 else 97.0}


def test_a_straggler_finding_clears_when_the_job_ends() -> None:
    def job(t: int, _gpu: int) -> Workload | None:
        return pretraining(t, _gpu) if t < 1500 else None  # the scheduler says the job ended; the GPU stays slow

    _det, found, _ = run(2400, _slow_gpu_5, job=job)
    assert kinds(found) == {("straggler", "GPU-5")}
    cleared = [f for f in found if f.detector == "straggler" and not f.active]
    assert len(cleared) == 1 and cleared[0].ts_ns == T0 + 1500 * S
    assert not any(f.active for f in found if f.detector == "straggler" and f.ts_ns > T0 + 1500 * S)


def _pair(_t: int, _gpu: int) -> Workload:
    return Workload("llm-finetuning", job_id="job-2", source="simulator", confidence=1.0, job_gpus=2)


def test_the_slower_gpu_of_a_two_gpu_job_by_its_clock() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if t < 600:
            return m
        if gpu == 1:  # its clock holds the pair back; it never waits
            return m | {"sm_clock_mhz": float(round(0.71 * m["sm_clock_mhz"])), "utilization_gpu_percent": 97.0}
        return m | {"utilization_gpu_percent": 35.0 if t % 10 < 3 else 97.0}  # its peer waits at every step

    _det, found, _ = run(1500, shape, job=_pair, gpus=2)
    assert kinds(found) == {("straggler", "GPU-1")}
    first = starts(found)[0]
    assert first.evidence["peers"] == 2 and first.evidence["slower_than_median"] == pytest.approx(0.41, abs=0.05)
    assert "than its one peer per step" in first.summary
    _det, found, _ = run(1500, job=_pair, gpus=2)  # a healthy pair: nothing
    assert not starts(found, "straggler")


def test_gpus_without_a_job_id_are_not_peers() -> None:
    def inferred(_t: int, _gpu: int) -> Workload:
        # what the classifier says of a node without context: same application, but no job, no peers known
        return Workload("llm-pretraining", source="inferred", confidence=0.95)

    _det, found, _ = run(1800, _slow_gpu_5, job=inferred)
    assert not starts(found, "straggler")
    _det, found, _ = run(1800, _slow_gpu_5)  # the same telemetry with the job context: found
    assert kinds(found) == {("straggler", "GPU-5")}


def test_straggler_explained_by_thermal_throttling_is_reported_once() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu == 5 and t >= 300:
            return m | {"sm_clock_mhz": 1200.0, "temperature_gpu_celsius": 90.0,
                        "throttle_reasons_mask": float(HW_THERMAL)}  # fmt: skip
        return m

    _det, found, _ = run(1200, shape)
    assert kinds(found) == {("thermal-throttling", "GPU-5")}


def test_a_gpu_slowed_by_its_xid_storm_is_not_also_a_straggler() -> None:
    def events(t: int) -> list[GpuEvent]:
        if 600 <= t < 1500 and t % 20 == 0:  # channel resets (43, 45) stall the GPU's work
            return [GpuEvent("c1", "node-1", "GPU-5", 5, T0 + t * S, EventKind.XID, (43, 45)[t // 20 % 2], "")]
        return []

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return _slow_gpu_5(t + 300, gpu, m) if t >= 700 else m  # the storm (5 XIDs) is known from t=680

    _det, found, _ = run(1500, shape, events=events)
    assert kinds(found) == {("xid", "GPU-5"), ("xid-storm", "GPU-5")}
    _det, found, _ = run(1500, shape)  # the same slowness without the storm: a straggler
    assert kinds(found) == {("straggler", "GPU-5")}


def test_a_gpu_slowed_by_its_memory_leak_is_not_also_a_straggler() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu != 5 or t < 600:
            return m | {"memory_used_bytes": 24.0 * GIB} if gpu == 5 else m
        used = min(0.99, 0.3 + (t - 600) / 60 * 0.08)  # +8% of memory a minute: full within 10 minutes
        slowed = _slow_gpu_5(t + 300, gpu, m) if t >= 800 else m  # the leaking process thrashes, then stalls
        return slowed | {"memory_used_bytes": float(round(80 * GIB * used))}

    _det, found, _ = run(1500, shape)
    assert kinds(found) == {("memory-leak", "GPU-5")}


def test_xid_storm_versus_a_single_xid() -> None:
    def events(t: int) -> list[GpuEvent]:
        out = []
        if t == 100:
            out.append(GpuEvent("c1", "node-1", "GPU-1", 1, T0 + t * S, EventKind.XID, 13, "graphics exception"))
        if 600 <= t < 780 and t % 20 == 0:
            code = (13, 31, 94, 45)[t // 20 % 4]  # 94 (contained ECC error) without ECC counters: part of the storm
            out.append(GpuEvent("c1", "node-1", "GPU-6", 6, T0 + t * S, EventKind.XID, code, ""))
        return out

    _det, found, _ = run(1500, events=events)
    assert kinds(found) == {("xid", "GPU-1"), ("xid", "GPU-6"), ("xid-storm", "GPU-6")}
    storm = starts(found, "xid-storm")[0]
    assert storm.ts_ns == T0 + 680 * S and storm.severity == "critical"
    assert "XID storm: 5 XIDs" in storm.summary and "94 (" in storm.summary
    single = starts(found, "xid")[0]
    assert "XID 13" in single.summary and single.severity == "warning"
    # the single XID on GPU-6 became part of the storm: cleared when the storm started
    assert [f.ts_ns for f in found if f.detector == "xid" and f.gpu_uuid == "GPU-6" and not f.active] == [storm.ts_ns]


def test_uncorrectable_ecc_from_counters_events_and_remap() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu == 2 and t >= 300:
            return m | {"ecc_uncorrected_total": 2.0, "row_remap_uncorrectable_total": 1.0, "row_remap_pending": 1.0}
        return m

    def events(t: int) -> list[GpuEvent]:
        if t == 301:
            return [GpuEvent("c1", "node-1", "GPU-2", 2, T0 + t * S, EventKind.XID, 48, "DBE"),
                    GpuEvent("c1", "node-1", "GPU-2", 2, T0 + t * S, EventKind.XID, 63, "row remap")]  # fmt: skip
        return []

    _det, found, _ = run(600, shape, events=events)
    assert kinds(found) == {("ecc-uncorrectable", "GPU-2")}
    first = starts(found)[0]
    assert first.ts_ns == T0 + 300 * S and first.severity == "critical"
    assert first.evidence["ecc_uncorrected_total"] == 2 and first.evidence["remap_pending"] == 1
    assert "drain the GPU and reset it" in first.action


def test_row_remap_pending_alone_is_a_row_remap_warning() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | {"row_remap_pending": 1.0} if gpu == 0 and t >= 100 else m

    _det, found, _ = run(300, shape, gpus=2)
    assert kinds(found) == {("row-remap", "GPU-0")}


@pytest.mark.parametrize("with_event", [True, False])
def test_fallen_off_the_bus(with_event: bool) -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float] | None:
        return None if gpu == 7 and 500 <= t < 900 else m

    def events(t: int) -> list[GpuEvent]:
        if with_event and t == 499:
            return [GpuEvent("c1", "node-1", "GPU-7", 7, T0 + t * S, EventKind.XID, 79, "fallen off the bus"),
                    GpuEvent("c1", "node-1", "GPU-7", 7, T0 + t * S, EventKind.GPU_LOST, 0, "")]  # fmt: skip
        return []

    _det, found, _ = run(1200, shape, events=events)
    assert kinds(found) == {("fallen-off-bus", "GPU-7")}
    first = starts(found)[0]
    assert first.ts_ns == (T0 + 499 * S if with_event else T0 + 514 * S)
    assert first.severity == "critical" and "reboot" in first.action
    (clear,) = [f for f in found if not f.active]
    assert clear.ts_ns == T0 + 930 * S


def test_idle_but_allocated() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | {"utilization_gpu_percent": 0.0, "power_watts": 80.0} if gpu == 1 else m

    _det, found, _ = run(1800, shape, gpus=2)
    assert kinds(found) == {("idle-capacity", "GPU-1")}
    first = starts(found)[0]
    assert first.severity == "info" and T0 + 600 * S < first.ts_ns < T0 + 800 * S


def test_fast_forward_batches_find_the_same_as_live_ones() -> None:
    """Many rounds per batch (fast-forward replay) give the same findings at the same data times."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float] | None:
        if gpu == 3 and 300 <= t < 600:
            m |= {"temperature_gpu_celsius": 89.0, "throttle_reasons_mask": float(HW_THERMAL), "sm_clock_mhz": 1200.0}
        if gpu == 5 and t >= 900:
            m |= {"sm_clock_mhz": 1300.0}
        return None if gpu == 7 and t >= 1000 else m

    _d, live, _ = run(1300, shape)
    _d, replayed, _ = run(1300, shape, rounds_per_batch=37)
    key = [(f.detector, f.gpu_uuid, f.active, f.since_ns) for f in starts(live)]
    assert key == [(f.detector, f.gpu_uuid, f.active, f.since_ns) for f in starts(replayed)]
    assert {f.detector for f in starts(live)} == {"thermal-throttling", "straggler", "fallen-off-bus"}


def test_disabled_stage_passes_batches_through() -> None:
    det = Detectors(DetectorSettings(enabled=False))

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | {"nvlink_links_active": 0.0}

    _d, found, _ = run(100, shape, detectors=det)
    assert found == []
