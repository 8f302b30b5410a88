"""NVML events -> GpuEvents, on the fake NVML (real captures' devices, injected events)."""

from __future__ import annotations

import pynvml

from pipeline.events import EventKind
from producers.nvml import NvmlCollector, NvmlSource
from producers.nvml.capture import CapturedGpu, CapturedMig
from producers.nvml.events import EVENT_KINDS, WATCHED, EventWatcher
from producers.nvml.replay import ReplayNvml
from tests.fakes.nvml import load_capture

T0 = 1_700_000_000_000_000_000


def watcher_for(*names: str) -> tuple[ReplayNvml, NvmlCollector, EventWatcher]:
    fake = ReplayNvml([g for n in names for g in load_capture(n)])
    collector = NvmlCollector(fake, "dc1", "n1")
    collector.open()
    watcher = EventWatcher(fake, "dc1", "n1")
    watcher.open(collector.devices)
    return fake, collector, watcher


def test_event_bits_are_nvmls() -> None:
    names = {
        EventKind.ECC_SINGLE_BIT: "nvmlEventTypeSingleBitEccError",
        EventKind.ECC_DOUBLE_BIT: "nvmlEventTypeDoubleBitEccError",
        EventKind.PSTATE: "nvmlEventTypePState",
        EventKind.XID: "nvmlEventTypeXidCriticalError",
        EventKind.CLOCK_CHANGE: "nvmlEventTypeClock",
        EventKind.POWER_SOURCE: "nvmlEventTypePowerSourceChange",
        EventKind.MIG_CONFIG: "nvmlEventMigConfigChange",
        EventKind.ROW_REMAP: "nvmlEventTypeDramRetirementEvent",
        EventKind.GPU_LOST: "nvmlEventTypeGpuUnavailableError",
    }
    assert {getattr(pynvml, n): k for k, n in names.items()} == EVENT_KINDS


def test_an_xid_becomes_a_typed_event_on_the_right_gpu() -> None:
    fake, collector, watcher = watcher_for("dual_2080-v13.xml")
    fake.inject_event(1, pynvml.nvmlEventTypeXidCriticalError, 79)
    events = watcher.drain(T0)
    assert len(events) == 1
    event = events[0]
    assert (event.kind, event.code, event.gpu_index) == (EventKind.XID, 79, 1)
    assert event.gpu_uuid == collector.devices[1].uuid
    assert event.dedup_key == f"dc1/n1/{event.gpu_uuid}/xid/79/{T0}"
    assert watcher.drain(T0 + 10**9) == []


def test_two_identical_xids_in_one_round_stay_two_events() -> None:
    fake, _, watcher = watcher_for("a10g.xml")
    for _ in range(2):
        fake.inject_event(0, pynvml.nvmlEventTypeXidCriticalError, 13)
    events = watcher.drain(T0)
    assert [e.code for e in events] == [13, 13]
    assert len({e.dedup_key for e in events}) == 2


def test_pstate_bursts_are_coalesced_per_gpu_and_clock_changes_not_watched() -> None:
    """A real H100 raised ~30 clock-change events a second (nvml-h100-lent/README.md): not registered for."""
    fake, _, watcher = watcher_for("dual_2070-v13.xml")
    for _ in range(5):
        fake.inject_event(0, pynvml.nvmlEventTypePState)
        fake.inject_event(0, pynvml.nvmlEventTypeClock)
    fake.inject_event(1, pynvml.nvmlEventTypePState)
    events = watcher.drain(T0)
    kinds = sorted((e.gpu_index, e.kind.value) for e in events)
    assert kinds == [(0, "pstate"), (1, "pstate")]
    assert watcher.stats.coalesced == 4
    assert not WATCHED & pynvml.nvmlEventTypeClock


def test_ecc_events_only_where_ecc_is_enabled() -> None:
    fake, _, watcher = watcher_for("a10g.xml", "rtx-3090-v12.xml")  # ECC on the A10G only
    fake.inject_event(0, pynvml.nvmlEventTypeDoubleBitEccError)
    fake.inject_event(1, pynvml.nvmlEventTypeDoubleBitEccError)
    events = watcher.drain(T0)
    assert [(e.kind, e.gpu_index) for e in events] == [(EventKind.ECC_DOUBLE_BIT, 0)]
    assert len(fake.events) == 1  # the 3090 never registered for ECC events, so NVML keeps nothing for it


def test_the_source_reports_a_lost_gpu_once_even_when_nvml_also_says_so() -> None:
    fake = ReplayNvml(load_capture("dual_2080-v13.xml"))
    source = NvmlSource(fake, "dc1", "n1", infiniband=False)
    source.open()
    fake.events.append((0, pynvml.nvmlEventTypeXidCriticalError, 79))
    fake.lose(0)
    (batch,) = source.collect(T0)
    assert sorted(e.kind.value for e in batch.events) == ["gpu_lost", "xid"]
    assert [s.gpu_index for s in batch.samples] == [1]
    (batch,) = source.collect(T0 + 10**9)
    assert batch.events == () and [s.gpu_index for s in batch.samples] == [1]


def test_a_mig_reconfiguration_event_makes_the_source_reread_the_layout() -> None:
    base = load_capture("a10g.xml")[0]
    parent = CapturedGpu(
        "NVIDIA A100-SXM4-40GB",
        "GPU-0c1f3a2e-aaaa-bbbb-cccc-000000000001",
        "00000000:07:00.0",
        base.values | {"mig.current": 1},
        migs=[CapturedMig(f"MIG-{i}", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 7 + i, 0, 4864 * 2**20, 0) for i in range(3)],
    )  # synthetic: no capture has MIG
    fake = ReplayNvml([parent])
    source = NvmlSource(fake, "dc1", "n1", infiniband=False)
    source.open()
    (batch,) = source.collect(T0)
    assert len(batch.samples) == 4
    parent.migs = parent.migs[:1]  # an operator destroyed two instances
    fake.inject_event(0, pynvml.nvmlEventMigConfigChange)
    (batch,) = source.collect(T0 + 10**9)
    assert [e.kind for e in batch.events] == [EventKind.MIG_CONFIG]
    assert sorted(s.gpu_uuid for s in batch.samples) == [parent.uuid, "MIG-0"]
    assert [g.uuid for g in source.topologies(T0)[0].gpus] == [parent.uuid, "MIG-0"]
