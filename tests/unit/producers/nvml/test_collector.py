"""The NVML collector on a fake NVML replaying the real nvidia-smi captures (no GPU needed)."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from collections import Counter

import pynvml
import pytest

from pipeline.codec import encode_samples
from pipeline.config import ValidationSettings
from pipeline.events import METRIC_INDEX, EventKind, SampleBatch
from processors.normalize import RawMessage, process_raw
from producers.nvml import NvmlCollector
from producers.nvml.capture import (
    CapturedGpu,
    CapturedLink,
    CapturedMig,
    CapturedProcess,
    gpu_from_xml,
    parse_mig_text,
)
from producers.nvml.collector import Costly
from producers.nvml.readings import readings, sysfs_bus_id
from producers.nvml.replay import ReplayNvml
from tests.fakes.nvml import CAPTURES, capture_names, load_capture

MIB = 2**20
T0 = 1_700_000_000_000_000_000


def collector_for(*names: str, **kwargs: object) -> tuple[ReplayNvml, NvmlCollector]:
    gpus = [g for name in names for g in load_capture(name)]
    fake = ReplayNvml(gpus)
    collector = NvmlCollector(fake, "dc1", "node-1", **kwargs)  # type: ignore[arg-type]
    collector.open()
    return fake, collector


def one_sample(name: str, rounds: int = 1) -> dict[str, float]:
    _, collector = collector_for(name)
    for r in range(rounds):
        samples, _ = collector.collect(T0 + r * 1_000_000_000)
    return samples[0].metrics


@pytest.mark.parametrize("name", capture_names())
def test_every_capture_loads_and_each_gpu_is_one_sample_with_its_identity(name: str) -> None:
    root = ET.parse(CAPTURES / name).getroot()
    xml_gpus = root.findall("gpu")
    _, collector = collector_for(name)
    samples, events = collector.collect(T0)
    assert events == []
    assert [s.gpu_uuid for s in samples] == [g.findtext("uuid") for g in xml_gpus]
    assert [s.gpu_model for s in samples] == [g.findtext("product_name") for g in xml_gpus]
    assert [s.gpu_index for s in samples] == list(range(len(xml_gpus)))
    for sample, gpu in zip(samples, xml_gpus, strict=True):
        # values the capture prints as N/A are absent; printed ones are there with the capture's value
        for path, field, scale in (
            ("fan_speed", "fan_speed_percent", 1),
            ("utilization/gpu_util", "utilization_gpu_percent", 1),
            ("fb_memory_usage/used", "memory_used_bytes", MIB),
            ("fb_memory_usage/total", "memory_total_bytes", MIB),
            ("pci/replay_counter", "pcie_replay_total", 1),
            ("temperature/gpu_temp_slow_threshold", "temperature_slowdown_celsius", 1),
        ):
            text = (gpu.findtext(path) or "N/A").strip()
            if text == "N/A" or gpu.find(path) is None:
                if not name.startswith(("rtx-4000-sff-ada", "h100-80gb-hbm3-lent")):  # derived from T.Limit (below)
                    assert field not in sample.metrics, (name, field)
            else:
                assert sample.metrics[field] == float(text.split()[0].rstrip("x")) * scale, (name, field)
        assert all(isinstance(v, int | float) for v in sample.metrics.values())


def test_the_collector_output_passes_the_processors_validation() -> None:
    batches = []
    for name in capture_names():
        _, collector = collector_for(name)
        collector.collect(time.time_ns() - 10**9)
        samples, _ = collector.collect(time.time_ns())
        batches.append(SampleBatch("dc1", name, tuple(samples)))
    raw = [RawMessage(b.kafka_key, encode_samples(b), f"raw/0/{i}") for i, b in enumerate(batches)]
    outcome = process_raw(raw, time.time_ns(), ValidationSettings())
    assert outcome.dead == [], [(d.reason, dict(d.headers)) for d in outcome.dead]
    assert outcome.samples_ok == sum(len(b.samples) for b in batches) == 19


def test_user_lowered_power_cap_is_the_limit_and_the_default_is_kept_apart() -> None:
    m = one_sample("rtx-3090-v12.xml")
    assert m["power_limit_watts"] == 200.0
    assert m["power_default_limit_watts"] == 350.0
    assert m["power_watts"] == pytest.approx(27.23)
    raised = one_sample("rtx-3080-v12.xml")
    assert (raised["power_limit_watts"], raised["power_default_limit_watts"]) == (336.0, 320.0)


def test_loaded_capture_values() -> None:
    m = one_sample("rtx-3080-v13.xml")
    assert m["utilization_gpu_percent"] == 65
    assert m["performance_state"] == 2
    assert m["sm_clock_mhz"] == 1950 and m["sm_clock_max_mhz"] == 2100
    assert m["memory_clock_mhz"] == 9251 and m["memory_clock_max_mhz"] == 9501
    assert m["power_watts"] == pytest.approx(139.62)  # NVML's 1 s average on Ampere (average_power_draw)
    assert m["throttle_reasons_mask"] == 0
    assert m["memory_used_bytes"] == 9184 * MIB and m["memory_reserved_bytes"] == 397 * MIB


def test_ada_thresholds_are_derived_from_the_tlimit_margin() -> None:
    # gpu_temp 38 C, T.Limit margin 49 C, slowdown at -2 C and shutdown at -7 C relative to T.Limit
    m = one_sample("rtx-4000-sff-ada-v13.xml")
    assert m["temperature_gpu_celsius"] == 38
    assert m["temperature_slowdown_celsius"] == 38 + 49 + 2
    assert m["temperature_shutdown_celsius"] == 38 + 49 + 7


def test_vgpu_guest_yields_almost_nothing_and_no_zero_sensors() -> None:
    m = one_sample("tesla_p4.xml", rounds=2)
    assert set(m) == {
        "utilization_gpu_percent",
        "utilization_memory_percent",
        "memory_used_bytes",
        "memory_total_bytes",
        "memory_reserved_bytes",
        "performance_state",
        "process_count",
    }
    _, collector = collector_for("tesla_p4.xml")
    samples, _ = collector.collect(T0)
    procs = samples[0].processes
    assert procs is not None and len(procs) == 13
    assert all(p.used_memory_bytes is None for p in procs)  # WDDM: NVML cannot tell per-process memory
    assert [p.name for p in procs if p.name] == ["C:\\Windows\\explorer.exe"]


def test_no_power_reading_but_a_limit_and_ecc_and_row_remap_where_supported() -> None:
    gt = one_sample("gt-1030.xml")
    assert "power_watts" not in gt and gt["power_limit_watts"] == 30.0
    a10g = one_sample("a10g.xml")
    assert a10g["ecc_corrected_total"] == 0 and a10g["ecc_uncorrected_total"] == 0
    assert a10g["row_remap_correctable_total"] == 0 and a10g["row_remap_failure"] == 0
    assert "ecc_corrected_total" not in one_sample("rtx-4000-sff-ada-v13.xml")  # ECC disabled on that board


def test_processes_with_their_memory_and_kind() -> None:
    _, collector = collector_for("rtx-4000-sff-ada-v13.xml")
    samples, _ = collector.collect(T0)
    procs = {p.pid: p for p in samples[0].processes or ()}
    assert procs[4937].name == "python" and procs[4937].kind == "compute"
    assert procs[4937].used_memory_bytes == 160 * MIB
    assert procs[1842].kind == "graphics" and procs[1842].used_memory_bytes == 410 * MIB
    assert procs[34626].kind == "compute"  # C+G counts once
    assert samples[0].metrics["process_count"] == 4


def test_unsupported_readings_are_cached_and_not_asked_again() -> None:
    fake, collector = collector_for("tesla_p4.xml")
    fake.record = []
    collector.collect(T0)
    first = Counter(name for name, _ in fake.record)
    fake.record = []
    collector.collect(T0 + 10**9)
    second = Counter(name for name, _ in fake.record)
    assert first["nvmlDeviceGetPowerUsage"] == 1 and second["nvmlDeviceGetPowerUsage"] == 0
    assert second["nvmlDeviceGetPcieThroughput"] == 0
    assert second["nvmlDeviceGetUtilizationRates"] == 1
    assert sum(second.values()) < sum(first.values())


def test_pcie_rates_come_from_counter_deltas_and_the_first_round_has_none() -> None:
    gpus = load_capture("rtx-3090-v12.xml")
    gpus[0].values |= {"pcie.tx_bytes": 10_000_000, "pcie.rx_bytes": 5_000}
    fake = ReplayNvml(gpus)
    collector = NvmlCollector(fake, "dc1", "n1")
    collector.open()
    first, _ = collector.collect(T0)
    assert "pcie_tx_bytes_per_second" not in first[0].metrics  # counters work, so no sampled fallback either
    gpus[0].values |= {"pcie.tx_bytes": 10_000_000 + 3_000_000, "pcie.rx_bytes": 5_000 + 1_000}
    second, _ = collector.collect(T0 + 500_000_000)
    assert second[0].metrics["pcie_tx_bytes_per_second"] == pytest.approx(6_000_000)
    assert second[0].metrics["pcie_rx_bytes_per_second"] == pytest.approx(2_000)
    gpus[0].values |= {"pcie.tx_bytes": 1_000}  # counter reset (driver reload): no rate, not a negative one
    third, _ = collector.collect(T0 + 10**9)
    assert "pcie_tx_bytes_per_second" not in third[0].metrics
    assert third[0].metrics["pcie_rx_bytes_per_second"] == 0.0  # rx did not move: a measured zero


def test_sampled_pcie_fallback_can_be_switched_off() -> None:
    _, collector = collector_for("rtx-3080-v12.xml", pcie_throughput_fallback=False)
    samples, _ = collector.collect(T0)
    assert "pcie_tx_bytes_per_second" not in samples[0].metrics
    _, with_fallback = collector_for("rtx-3080-v12.xml")
    samples, _ = with_fallback.collect(T0)
    assert samples[0].metrics["pcie_rx_bytes_per_second"] == 6000 * 1024  # capture: rx_util 6000 KB/s


def test_a_lost_gpu_is_one_event_and_the_other_gpus_keep_being_read() -> None:
    fake, collector = collector_for("dual_2080-v13.xml")
    fake.lose(0)
    samples, events = collector.collect(T0)
    assert [s.gpu_index for s in samples] == [1]
    assert [(e.kind, e.gpu_index) for e in events] == [(EventKind.GPU_LOST, 0)]
    assert "GPU is lost" in events[0].detail
    samples, events = collector.collect(T0 + 10**9)
    assert [s.gpu_index for s in samples] == [1] and events == []
    assert collector.stats.lost_gpus == 1


def test_an_unknown_error_on_one_gpu_costs_only_that_gpu_and_only_while_it_lasts() -> None:
    fake, collector = collector_for("dual_2070-v13.xml")
    fake.fail(0, pynvml.NVML_ERROR_UNKNOWN)
    samples, events = collector.collect(T0)
    assert [s.gpu_index for s in samples] == [1] and events == []
    assert collector.stats.empty_samples == 1 and collector.stats.nvml_errors > 0
    fake.heal(0)
    samples, _ = collector.collect(T0 + 10**9)
    assert [s.gpu_index for s in samples] == [0, 1]
    assert samples[0].metrics["power_watts"] == pytest.approx(9.23)  # transient: not cached as unsupported


def test_a_transient_error_leaves_one_field_out_for_one_round() -> None:
    fake, collector = collector_for("a10g.xml")
    fake.fail(0, pynvml.NVML_ERROR_TIMEOUT, {"nvmlDeviceGetPowerUsage"})
    samples, _ = collector.collect(T0)
    assert "power_watts" not in samples[0].metrics and "temperature_gpu_celsius" in samples[0].metrics
    fake.heal(0)
    samples, _ = collector.collect(T0 + 10**9)
    assert samples[0].metrics["power_watts"] == pytest.approx(25.58)


def test_a_gpu_lost_before_start_is_skipped_and_the_rest_open() -> None:
    fake = ReplayNvml(load_capture("dual_2080-v13.xml"))
    fake.lose(1)
    collector = NvmlCollector(fake, "dc1", "n1")
    collector.open()
    assert [d.index for d in collector.devices] == [0]


def _nvlink_pair() -> tuple[ReplayNvml, list[CapturedGpu]]:
    gpus = load_capture("dual_2080-v13.xml")  # real boards; their NVLink bridge is described here, not captured
    a, b = gpus
    a.links = [CapturedLink(b.pci_bus_id), CapturedLink(b.pci_bus_id)]
    b.links = [CapturedLink(a.pci_bus_id), CapturedLink(a.pci_bus_id)]
    return ReplayNvml(gpus), gpus


def test_nvlink_state_errors_and_per_link_throughput() -> None:
    fake, gpus = _nvlink_pair()
    collector = NvmlCollector(fake, "dc1", "n1")
    collector.open()
    first, _ = collector.collect(T0)
    links = first[0].links
    assert links is not None and [link.link for link in links] == [0, 1]
    assert all(link.active and link.tx_bytes_per_second is None for link in links)
    assert links[0].remote_pci_bus_id == sysfs_bus_id(gpus[1].pci_bus_id)
    assert first[0].metrics["nvlink_links_active"] == 2 and first[0].metrics["nvlink_links_max"] == 2
    assert "nvlink_tx_bytes_per_second" not in first[0].metrics
    gpus[0].links[0].tx_kib += 1_000_000
    gpus[0].links[1].tx_kib += 500_000
    gpus[0].links[1].active = False
    gpus[0].links[1].crc_flit, gpus[0].links[1].crc_data, gpus[0].links[1].replay = 3, 2, 7
    second, _ = collector.collect(T0 + 2 * 10**9)
    m = second[0].metrics
    links = second[0].links
    assert links is not None
    assert links[0].tx_bytes_per_second == pytest.approx(1_000_000 * 1024 / 2)
    assert links[1].active is False and links[1].crc_errors_total == 5 and links[1].replay_errors_total == 7
    assert m["nvlink_links_active"] == 1
    assert m["nvlink_tx_bytes_per_second"] == pytest.approx(1_500_000 * 1024 / 2)
    assert m["nvlink_crc_errors_total"] == 5 and m["nvlink_replay_errors_total"] == 7
    assert first[0].links is not None and "nvlink_links_max" not in one_sample("dual_2080-v13.xml")


def _a100_with_mig(report_memory: bool = True) -> ReplayNvml:
    """No capture has a MIG GPU: an A100 described from the catalogue (synthetic), two 1g.5gb instances."""
    base = load_capture("a10g.xml")[0]  # a real capture's answers for everything MIG does not change
    parent = CapturedGpu(
        "NVIDIA A100-SXM4-40GB",
        "GPU-0c1f3a2e-aaaa-bbbb-cccc-000000000001",
        "00000000:07:00.0",
        base.values | {"mig.current": 1, "util.gpu": None, "util.memory": None},
    )
    memory = 4864 * MIB if report_memory else None
    parent.migs = [
        CapturedMig("MIG-11111111-2222-3333-4444-555555555555", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 13, 0, 0, 0),
        CapturedMig("MIG-66666666-7777-8888-9999-000000000000", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 14, 0, 0, 0),
    ]
    for mig in parent.migs:
        mig.memory_total = memory
        mig.memory_used = 1024 * MIB
    parent.migs[0].processes = [CapturedProcess(4242, "python", "C", 1000 * MIB)]
    return ReplayNvml([parent])


def test_each_mig_instance_is_a_sample_of_its_own() -> None:
    fake = _a100_with_mig()
    collector = NvmlCollector(fake, "dc1", "n1")
    collector.open()
    samples, _ = collector.collect(T0)
    by_uuid = {s.gpu_uuid: s for s in samples}
    assert len(samples) == 3
    mig = by_uuid["MIG-11111111-2222-3333-4444-555555555555"]
    assert mig.gpu_model == "NVIDIA A100-SXM4-40GB MIG 1g.5gb" and mig.gpu_index == 0
    assert mig.metrics["memory_total_bytes"] == 4864 * MIB and mig.metrics["memory_used_bytes"] == 1024 * MIB
    assert mig.processes is not None and [p.pid for p in mig.processes] == [4242]
    assert "power_watts" not in mig.metrics  # power belongs to the whole GPU: on the parent's sample
    parent = by_uuid["GPU-0c1f3a2e-aaaa-bbbb-cccc-000000000001"]
    assert parent.metrics["power_watts"] == pytest.approx(25.58)
    assert "utilization_gpu_percent" not in parent.metrics
    assert {d.parent_uuid for d in collector.devices if d.is_mig} == {parent.gpu_uuid}


def test_mig_memory_comes_from_the_catalogue_profile_when_nvml_does_not_say() -> None:
    fake = _a100_with_mig(report_memory=False)
    collector = NvmlCollector(fake, "dc1", "n1")
    collector.open()
    samples, _ = collector.collect(T0)
    mig = next(s for s in samples if s.gpu_uuid.startswith("MIG-"))
    assert mig.metrics["memory_total_bytes"] == 5 * 2**30  # catalogue: A100-SXM4-40GB 1g.5gb


def test_every_reading_maps_to_a_schema_field() -> None:
    fake, collector = collector_for(*capture_names())
    gpus = fake.gpus
    gpus[0].values |= {"energy_mj": 123_456, "temp.memory": 71, "pcie.tx_bytes": 1, "pcie.rx_bytes": 1}
    collector.collect(T0)
    samples, _ = collector.collect(T0 + 10**9)
    produced = {name for s in samples for name in s.metrics}
    assert produced <= set(METRIC_INDEX)
    assert samples[0].metrics["energy_joules"] == pytest.approx(123.456)
    assert samples[0].metrics["temperature_memory_celsius"] == 71
    assert len({r.key for r in readings(pynvml)}) == len(readings(pynvml))


LENT = CAPTURES.parent / "nvml-h100-lent"


def lent_readings() -> list[dict[str, object]]:
    """The lent H100's samples as the real NVML gave them through NvmlSource (1 Hz: 15 s idle, 45 s bf16 matmul,
    15 s idle; tests/testdata/nvml-h100-lent/README.md)."""
    return [json.loads(line)["samples"][0] for line in (LENT / "readings.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("capture", "round_"), [("idle", 0), ("load", 37)])
def test_the_lent_h100s_capture_replays_as_its_real_nvml_read_it(capture: str, round_: int) -> None:
    """The nvidia-smi capture and the real NVML readings of the same H100 (the load capture was taken just before
    round 37 was read): every limit and every reading both have agree, derived T.Limit thresholds included."""
    real = lent_readings()[round_]
    _, collector = collector_for(f"h100-80gb-hbm3-lent-{capture}.xml")
    collector.collect(T0)
    replayed = collector.collect(T0 + 10**9)[0][0]
    live = {"power_watts", "temperature_gpu_celsius", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"}
    metrics: dict[str, float] = real["metrics"]  # type: ignore[assignment]
    same = {k: v for k, v in replayed.metrics.items() if k in metrics and k not in live}
    # nvidia-smi prints memory in MiB, NVML counts bytes
    assert same == {k: pytest.approx(metrics[k], abs=MIB if k.startswith("memory_") else 0) for k in same}
    assert len(same) >= 30
    assert replayed.metrics["power_watts"] == pytest.approx(metrics["power_watts"], rel=0.05)
    # what the capture does not print: the energy counter, the memory's own temperature limit, PCIe byte counters
    assert set(metrics) - set(replayed.metrics) <= {"energy_joules", "temperature_memory_max_celsius"} | live
    assert replayed.gpu_model == real["gpu_model"] == "NVIDIA H100 80GB HBM3"
    assert [(p.pid, p.used_memory_bytes) for p in replayed.processes or ()] == [
        (p["pid"], p["used_memory_bytes"])
        for p in real["processes"]  # type: ignore[attr-defined]
    ]


class CpuClock:
    """A thread CPU clock that moves only when a costly NVML call runs."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


@pytest.mark.parametrize("every", [1, 30])
def test_a_costly_reading_is_read_every_nth_round_and_absent_between(every: int) -> None:
    """The lent H100's total energy counter cost 3.9 ms of CPU per read (nvml-call-costs.txt): read every 30th
    round it is 1/30 of that; every other reading is still read every round."""
    gpus = load_capture("h100-80gb-hbm3-lent-idle.xml")
    gpus[0].values |= {"energy_mj": 3_108_452}
    fake, clock = ReplayNvml(gpus), CpuClock()
    energy = fake.nvmlDeviceGetTotalEnergyConsumption

    def costly(handle: object) -> int:
        clock.ns += 3_944_700
        return energy(handle)  # type: ignore[arg-type]

    fake.nvmlDeviceGetTotalEnergyConsumption = costly  # type: ignore[method-assign]
    power = fake.nvmlDeviceGetPowerUsage

    def once_slow(handle: object) -> int:  # one slow read in the timed rounds does not make a reading costly
        clock.ns += 500_000 if len(calls) == 1 else 1_000
        calls.append(1)
        return power(handle)  # type: ignore[arg-type]

    calls: list[int] = []
    fake.nvmlDeviceGetPowerUsage = once_slow  # type: ignore[method-assign]
    collector = NvmlCollector(fake, "dc1", "n1", costly=Costly(100.0, every), clock=clock)
    collector.open()
    rounds = [collector.collect(T0 + r * 10**9)[0][0].metrics for r in range(65)]
    with_energy = [r for r, m in enumerate(rounds) if "energy_joules" in m]
    assert with_energy == (list(range(65)) if every == 1 else [0, 1, 2, 3, 33, 63])  # timed in rounds 2-4
    assert all(m["energy_joules"] == 3108.452 for m in rounds if "energy_joules" in m)
    assert all("power_watts" in m and "pcie_replay_total" in m for m in rounds)
    assert collector.stats.costly_readings == (every > 1)


def test_costly_readings_follow_the_interval_setting() -> None:
    from pipeline.config import Settings
    from producers.nvml.source import NvmlSource

    def every(**collector: float) -> int:
        settings = Settings(sample_interval_s=2.0, collector=collector)
        return NvmlSource.configure(settings).costly_every

    assert every() == 15 and every(costly_read_interval_s=0) == 1 and every(costly_read_interval_s=61) == 30


MIG_CAPTURES = CAPTURES.parent / "nvidia-smi-q-mig"


def real_mig_board(board: str, state: str) -> tuple[CapturedGpu, list[CapturedMig]]:
    """The MIG devices of a real MIG-enabled board (nvidia_gpu_exporter's captures, tests/testdata/nvidia-smi-q-mig)
    and the board they were read on: the lent H100's capture for the H100 (same model; no XML of the MIG board
    was published), with what MIG turns off (utilization) unsupported; for the H200 a board answering nothing but
    its MIG mode."""
    listing = (MIG_CAPTURES / f"{board}-list.txt").read_text()
    [(uuid, migs)] = parse_mig_text(listing, (MIG_CAPTURES / f"{board}-{state}-q.txt").read_text()).items()
    if board == "nvidia-h100-mig":
        base = load_capture("h100-80gb-hbm3-lent-idle.xml")[0]
        values = base.values | {"mig.current": 1, "util.gpu": None, "util.memory": None}
        gpu = CapturedGpu(base.name, uuid, base.pci_bus_id, values, migs=migs)
    else:
        gpu = CapturedGpu("NVIDIA H200", uuid, "00000000:00:09.0", {"mig.current": 1}, migs=migs)
    return gpu, migs


def test_a_real_mig_h100_replays_as_one_sample_per_mig_device() -> None:
    """A real H100 with four MIG instances (3g.40gb, 2g.20gb, 2 x 1g.10gb) under gpu-burn and two memhogs on the
    3g instance: each instance a sample with its uuid, profile, memory and processes; the board keeps its own."""
    gpu, _ = real_mig_board("nvidia-h100-mig", "load")
    collector = NvmlCollector(ReplayNvml([gpu]), "dc1", "n1")
    collector.open()
    samples, _ = collector.collect(T0)
    board, *migs = samples
    assert board.gpu_uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert "utilization_gpu_percent" not in board.metrics and board.metrics["power_default_limit_watts"] == 700
    assert [(m.gpu_uuid[:12], m.gpu_model, m.gpu_index) for m in migs] == [
        ("MIG-00000000", "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 0),
        ("MIG-00000001", "NVIDIA H100 80GB HBM3 MIG 2g.20gb", 0),
        ("MIG-00000002", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 0),
        ("MIG-00000003", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 0),
    ]
    assert [m.metrics["memory_total_bytes"] / MIB for m in migs] == [40448, 20096, 9984, 9984]
    assert [m.metrics["memory_used_bytes"] / MIB for m in migs] == [11091, 17, 9, 9]
    burn = migs[0]
    assert burn.processes is not None
    assert [(p.pid, p.name, (p.used_memory_bytes or 0) // MIB) for p in burn.processes] == [
        (21180, "/root/tools/memhog", 2296), (21181, "/root/tools/memhog", 1272), (21198, "./gpu_burn", 7484),
    ]  # fmt: skip
    assert all(m.processes == () for m in migs[1:]) and burn.metrics["process_count"] == 3
    assert {d.gpu_instance_id for d in collector.devices if d.is_mig} == {2, 3, 9, 10}


def test_two_compute_instances_of_one_gpu_instance_share_its_memory() -> None:
    """A real H200 whose 3g.71gb GPU instance is split into two compute instances (1c and 2c): two samples that
    report the instance's memory (shared), the processes on the one they run on; their memory is also known
    where NVML would not say it (the catalogue's 3g.71gb)."""
    gpu, migs = real_mig_board("nvidia-h200-mig", "load")
    collector = NvmlCollector(ReplayNvml([gpu]), "dc1", "n1")
    collector.open()
    samples, _ = collector.collect(T0)
    one_c, two_c = (s for s in samples if s.gpu_model.endswith("c.3g.71gb"))
    assert one_c.gpu_model == "NVIDIA H200 MIG 1c.3g.71gb" and two_c.gpu_model == "NVIDIA H200 MIG 2c.3g.71gb"
    assert one_c.metrics["memory_used_bytes"] == two_c.metrics["memory_used_bytes"] == 16925 * MIB
    assert one_c.processes == () and two_c.processes is not None and len(two_c.processes) == 3
    for mig in migs:
        mig.memory_total = None  # NVML not saying: the catalogue's profile, a compute instance's its GPU instance's
    collector = NvmlCollector(ReplayNvml([gpu]), "dc1", "n1")
    collector.open()
    totals = {s.gpu_model: s.metrics.get("memory_total_bytes") for s in collector.collect(T0)[0]}
    assert totals["NVIDIA H200 MIG 1c.3g.71gb"] == totals["NVIDIA H200 MIG 2c.3g.71gb"] == 71424 * MIB
    assert totals["NVIDIA H200 MIG 1g.18gb"] == 16384 * MIB


def test_an_xml_captures_mig_devices_replay_as_its_instances() -> None:
    """``<mig_devices>`` of ``nvidia-smi -q -x``, written here with the real H100 MIG capture's values (its ``-q``
    text: no licensed XML capture with MIG devices was found) in the elements nvidia-smi's XML uses, on the lent
    H100's board capture: four instances, each a sample with its memory and processes. The XML names no profile
    and no uuid: a uuid from the parent's and the instance ids; a profile where the memory fits only one."""
    root = ET.parse(CAPTURES / "h100-80gb-hbm3-lent-load.xml").getroot()
    gpu = root.find("gpu")
    assert gpu is not None
    _, migs = real_mig_board("nvidia-h100-mig", "load")
    devices, processes = gpu.find("mig_devices"), gpu.find("processes")
    assert devices is not None and processes is not None
    devices.text, processes.text = None, None
    for p in list(processes):
        processes.remove(p)
    for i, mig in enumerate(migs):
        d = ET.SubElement(devices, "mig_device")
        for tag, value in (("index", i), ("gpu_instance_id", mig.gi_id), ("compute_instance_id", mig.ci_id)):
            ET.SubElement(d, tag).text = str(value)
        memory = ET.SubElement(d, "fb_memory_usage")
        ET.SubElement(memory, "total").text = f"{(mig.memory_total or 0) // MIB} MiB"
        ET.SubElement(memory, "used").text = f"{mig.memory_used // MIB} MiB"
        for proc in mig.processes:
            info = ET.SubElement(processes, "process_info")
            for tag, text in (("gpu_instance_id", mig.gi_id), ("compute_instance_id", mig.ci_id), ("pid", proc.pid),
                              ("type", proc.kind), ("process_name", proc.name),
                              ("used_memory", f"{(proc.used_memory_bytes or 0) // MIB} MiB")):  # fmt: skip
                ET.SubElement(info, tag).text = str(text)
    mig_mode = gpu.find("mig_mode/current_mig")
    assert mig_mode is not None
    mig_mode.text = "Enabled"
    board = gpu_from_xml(gpu, "derived")
    assert board.processes == []  # every process runs on an instance
    collector = NvmlCollector(ReplayNvml([board]), "dc1", "n1")
    collector.open()
    samples, _ = collector.collect(T0)
    found = [(s.gpu_uuid, s.gpu_model, s.metrics["memory_total_bytes"] // MIB, s.metrics["memory_used_bytes"] // MIB,
              len(s.processes or ())) for s in samples[1:]]  # fmt: skip
    parent = "00000000-0000-0000-0000-000000000000"
    assert found == [
        (f"MIG-{parent}/2/0", "NVIDIA H100 80GB HBM3 MIG 40gb", 40448, 11091, 3),  # 3g.40gb or 4g.40gb
        (f"MIG-{parent}/3/0", "NVIDIA H100 80GB HBM3 MIG 20gb", 20096, 17, 0),  # 1g.20gb or 2g.20gb
        (f"MIG-{parent}/9/0", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9984, 9, 0),
        (f"MIG-{parent}/10/0", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9984, 9, 0),
    ]
