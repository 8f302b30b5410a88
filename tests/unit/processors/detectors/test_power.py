"""Power capping: an operator's limit at a job's start (from the context or from new processes) is a setting, a
limit lowered mid-job is a fault, and several GPUs of a node lowered at once are one node-level finding."""

from __future__ import annotations

import pytest

from pipeline.events import (
    GpuProcess,
    Workload,
)
from tests.fakes.readings import GIB
from tests.unit.processors.detectors.driver import (
    SW_POWER_CAP,
    T0,
    S,
    kinds,
    pretraining,
    run,
    starts,
)


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


def test_a_node_without_context_whose_inferred_application_flips_as_its_supply_fails_is_still_capped() -> None:
    """Seed 38833's missed power capping: no context source, and the classifier's guess of the application changes
    as the lowered limits change the very features it guesses from. An inferred application is no job boundary
    (only processes and a context source are): the node's finding is raised as with a steady guess."""

    def guess(t: int, gpu: int) -> Workload:
        return Workload("llm-finetuning" if t < 400 else "bert-training", source="inferred", confidence=0.7)

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if t >= 400:
            m |= {"power_limit_watts": 400.0, "power_watts": 398.0, "throttle_reasons_mask": float(SW_POWER_CAP)}
        return m

    def processes(t: int, gpu: int) -> tuple[GpuProcess, ...]:
        return (GpuProcess(7000 + gpu, "python", None),)

    _det, found, _ = run(800, shape, job=guess, gpus=4, processes=processes)
    assert [(f.detector, f.gpu_uuid, f.ts_ns) for f in starts(found)] == [("power-capping", None, T0 + 520 * S)]
