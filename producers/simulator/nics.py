"""The fleet's InfiniBand/RoCE ports: each node kind's NICs, each on the rail of the GPUs it serves, read as
:class:`~pipeline.events.NicSample` every round at the load of its rail (the mean InfiniBand level of its GPUs);
healthy ports keep their error counters at zero."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from pipeline.events import NicSample
from producers.simulator.hardware import NodeKind, nic_names

NIC_FIELDS: Final = (
    "rx_bytes_per_second", "tx_bytes_per_second", "rx_packets_per_second", "tx_packets_per_second",
    "symbol_errors_total", "link_downed_total", "link_error_recovery_total", "rcv_errors_total",
    "xmit_discards_total", "port_state_active", "rate_gbps",
)  # fmt: skip


class NicRails:
    """Every NIC port of the fleet as flat arrays: its node, name, rate and the GPUs on its rail."""

    def __init__(self, kinds: Sequence[NodeKind], gpus_per_node: int) -> None:
        gpn = gpus_per_node
        node: list[int] = []
        name: list[str] = []
        rate: list[float] = []
        gpus: list[int] = []
        starts: list[int] = []
        span: list[int] = []
        for i, kind in enumerate(kinds):
            names = nic_names(kind)
            for k, nic in enumerate(names):
                rail = [i * gpn + g for g in range(gpn) if g * len(names) // gpn == k] or [i * gpn]
                node.append(i)
                name.append(nic)
                rate.append(kind.nic_rate_gbps)
                starts.append(len(gpus))
                span.append(len(rail))
                gpus += rail
        self.nodes = len(kinds)
        self._node, self._name = node, name
        self._gpus = np.array(gpus, dtype=np.int64)
        self._starts = np.array(starts, dtype=np.int64)
        self._span = np.array(span, dtype=np.float64)
        self._bytes = np.array(rate) * 1e9 / 8
        # error counters stay at zero on healthy ports; state ACTIVE; the port's rate
        self._static = np.column_stack([np.zeros((len(node), 5)), np.ones(len(node)), np.array(rate)])

    def samples(
        self, ib: np.ndarray, rng: np.random.Generator, cluster: str, nodes: Sequence[str], ts_ns: int
    ) -> list[tuple[NicSample, ...]]:
        """One NicSample per port, per node; ``ib``: each GPU's InfiniBand level this round."""
        if not len(self._node):
            return [()] * len(nodes)
        load = np.add.reduceat(ib[self._gpus], self._starts) / self._span
        noise = 1 + 0.02 * rng.standard_normal((len(load), 2))
        rx = np.maximum(load * self._bytes * noise[:, 0], 0.0).round() + 2e5
        tx = np.maximum(load * self._bytes * noise[:, 1], 0.0).round() + 2e5
        rows = np.column_stack([rx, tx, (rx / 4096).round(), (tx / 4096).round(), self._static]).tolist()
        out: list[list[NicSample]] = [[] for _ in nodes]
        for k, row in enumerate(rows):
            node = self._node[k]
            out[node].append(
                NicSample(cluster, nodes[node], self._name[k], 1, ts_ns, dict(zip(NIC_FIELDS, row, strict=True)))
            )
        return [tuple(ports) for ports in out]
