"""InfiniBand / RoCE port counters from a sysfs tree built like the kernel's."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import ValidationSettings
from pipeline.events import NIC_NAMES
from processors.normalize import nic_problem
from producers.infiniband import InfinibandReader, parse_rate_gbps, parse_state_active
from tests.fakes.sysfs import ib_port, pci_device, set_counters

T0 = 1_700_000_000_000_000_000

# an NDR port after some traffic (port_*_data in 4-octet words, per Documentation/ABI/stable/sysfs-class-infiniband)
COUNTERS = {
    "port_xmit_data": 93_750_000_000,
    "port_rcv_data": 87_500_000_000,
    "port_xmit_packets": 91_552_734,
    "port_rcv_packets": 85_449_218,
    "symbol_error": 0,
    "link_downed": 1,
    "link_error_recovery": 0,
    "port_rcv_errors": 3,
    "port_xmit_discards": 0,
}


def test_parsers() -> None:
    assert parse_rate_gbps("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate_gbps("56 Gb/sec (4X FDR)") == 56.0
    assert parse_rate_gbps("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate_gbps("garbage") is None
    assert parse_state_active("4: ACTIVE") == 1.0
    assert parse_state_active("1: DOWN") == 0.0
    assert parse_state_active("") is None


def test_ports_totals_then_rates_from_deltas(tmp_path: Path) -> None:
    nic = pci_device(tmp_path, ["pci0000:17", "0000:17:00.0", "0000:18:00.0"], 0, "0-31")
    port = ib_port(tmp_path, "mlx5_0", nic, counters=COUNTERS)
    reader = InfinibandReader(tmp_path)
    (first,) = reader.read("dc1", "n1", T0)
    assert (first.device, first.port) == ("mlx5_0", 1)
    assert first.metrics == {
        "port_state_active": 1.0,
        "rate_gbps": 400.0,
        "symbol_errors_total": 0.0,
        "link_downed_total": 1.0,
        "link_error_recovery_total": 0.0,
        "rcv_errors_total": 3.0,
        "xmit_discards_total": 0.0,
    }  # no rates before a second reading
    set_counters(
        port,
        {
            "port_xmit_data": COUNTERS["port_xmit_data"] + 2_500_000_000,  # 10 GB in words
            "port_rcv_data": COUNTERS["port_rcv_data"] + 1_250_000_000,
            "port_xmit_packets": COUNTERS["port_xmit_packets"] + 2_441_406,
            "port_rcv_packets": COUNTERS["port_rcv_packets"],
        },
    )
    (second,) = reader.read("dc1", "n1", T0 + 2 * 10**9)
    assert second.metrics["tx_bytes_per_second"] == pytest.approx(10e9 / 2)
    assert second.metrics["rx_bytes_per_second"] == pytest.approx(5e9 / 2)
    assert second.metrics["tx_packets_per_second"] == pytest.approx(2_441_406 / 2)
    assert second.metrics["rx_packets_per_second"] == 0.0
    assert set(second.metrics) <= set(NIC_NAMES)
    assert nic_problem(second, T0 + 2 * 10**9, ValidationSettings()) is None


def test_a_down_roce_port_with_a_counter_the_driver_lacks(tmp_path: Path) -> None:
    nic = pci_device(tmp_path, ["pci0000:3a", "0000:3a:00.0", "0000:3b:00.1"], 0, "0-31")
    counters = {k: v for k, v in COUNTERS.items() if k != "symbol_error"}
    ib_port(tmp_path, "mlx5_1", nic, state="1: DOWN", rate="100 Gb/sec (2X HDR)", link_layer="Ethernet",
            counters=counters)  # fmt: skip
    (sample,) = InfinibandReader(tmp_path).read("dc1", "n1", T0)
    assert sample.metrics["port_state_active"] == 0.0 and sample.metrics["rate_gbps"] == 100.0
    assert "symbol_errors_total" not in sample.metrics
    (nic_topology,) = InfinibandReader(tmp_path).topology()
    assert nic_topology.link_layer == "Ethernet" and nic_topology.pci_bus_id == "0000:3b:00.1"


def test_a_counter_going_backwards_gives_no_rate(tmp_path: Path) -> None:
    nic = pci_device(tmp_path, ["pci0000:17", "0000:17:00.0", "0000:18:00.0"], 0, "0-31")
    port = ib_port(tmp_path, "mlx5_0", nic, counters=COUNTERS)
    reader = InfinibandReader(tmp_path)
    reader.read("dc1", "n1", T0)
    set_counters(port, {"port_xmit_data": 10})  # counters reset (perfquery -R, driver reload)
    (sample,) = reader.read("dc1", "n1", T0 + 10**9)
    assert "tx_bytes_per_second" not in sample.metrics


def test_no_infiniband_means_no_nics(tmp_path: Path) -> None:
    reader = InfinibandReader(tmp_path)
    assert reader.read("dc1", "n1", T0) == ()
    assert reader.topology() == ()


def test_topology_of_the_nics(tmp_path: Path) -> None:
    nic = pci_device(tmp_path, ["pci0000:17", "0000:17:00.0", "0000:18:00.0"], 1, "32-63")
    ib_port(tmp_path, "mlx5_0", nic, counters=COUNTERS)
    ib_port(tmp_path, "mlx5_0", nic, port=2, state="1: DOWN", counters=COUNTERS)
    nics = InfinibandReader(tmp_path).topology()
    assert [(n.name, n.port, n.pci_bus_id, n.numa_node, n.rate_gbps) for n in nics] == [
        ("mlx5_0", 1, "0000:18:00.0", 1, 400.0),
        ("mlx5_0", 2, "0000:18:00.0", 1, 400.0),
    ]
