"""The simulator against real fleet data: AcmeTrace's LLM-cluster quantiles and Zeus's training power.

Run with ``-s`` to see the table of simulated against real quantiles (docs/simulator.md quotes it).
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict

import pytest

from producers.simulator import Fleet
from producers.simulator.calibration import QUANTILES, compare_acme, format_comparison, llm_cluster_batches
from tests import TESTDATA

T0 = 1_779_926_400_000_000_000  # a midnight, UTC


def _acme_reference() -> dict[str, tuple[float, ...]]:
    rows = csv.DictReader((TESTDATA / "acmetrace-utilization-cdfs" / "quantiles_summary.csv").open())
    return {
        r["series"].replace("_pct_of_80GiB", "_pct"): tuple(float(r[f"p{q}"]) for q in QUANTILES)
        for r in rows
        if "subset" not in r["series"]
    }


@pytest.mark.parametrize("day", [0, 1])
def test_llm_cluster_mix_matches_acmetrace_quantiles(day: int) -> None:
    """128 A100 nodes of the ``llm-a100`` mix, eight 20-minute windows spread over a day (sampled every 30 s after
    a 10-minute warm-up), against the range spanned by Seren and Kalos, within each series' stated tolerance."""
    batches = llm_cluster_batches(T0 + day * 86_400 * 10**9, seed=10 * day)
    rows = compare_acme(batches, _acme_reference())
    print("\n" + format_comparison(rows))
    assert {r.series for r in rows} == {"GPU_UTIL_pct", "SM_ACTIVE_pct", "FB_USED_pct", "GPU_POWER_W", "GPU_TEMP_C"}
    for row in rows:
        assert row.misses() == [], (row.series, row.simulated, row.low, row.high, row.tolerance)


def _zeus_fraction(network: str) -> float:
    """Median average power / power limit at each GPU's highest (default) limit, over V100, A40 and RTX 6000."""
    rows = list(csv.DictReader((TESTDATA / "zeus-gpu-power-profiles" / "summary_power_all_gpus.csv").open()))
    top: dict[str, float] = defaultdict(float)
    for r in rows:
        top[r["gpu"]] = max(top[r["gpu"]], float(r["power_limit"]))
    return statistics.median(
        float(r["average_power"]) / float(r["power_limit"])
        for r in rows
        if r["network"] == network and r["gpu"] != "P100" and float(r["power_limit"]) == top[r["gpu"]]
    )


@pytest.mark.parametrize(("app", "network"), [("bert-training", "bert_base_uncased"), ("resnet-training", "resnet50")])
def test_training_power_matches_zeus(app: str, network: str) -> None:
    """Mean power / limit of the simulator's training GPUs in the compute phase, against Zeus (within 0.05)."""
    fleet = Fleet(60, 8, seed=2)
    fractions: list[float] = []
    for s in range(0, 1800, 10):
        batches = fleet.tick(T0 + s * 10**9)
        apps, phases = fleet.applications(), fleet.phases()
        for b in batches:
            for sample in b.samples:
                g = fleet.uuids.index(sample.gpu_uuid)
                if apps[g] == app and phases[g] == "compute":
                    fractions.append(sample.metrics["power_watts"] / sample.metrics["power_limit_watts"])
    assert len(fractions) > 500
    real = _zeus_fraction(network)
    simulated = statistics.mean(fractions)
    print(f"\n{app}: simulated {simulated:.3f} of the power limit, Zeus {network} {real:.3f}")
    assert simulated == pytest.approx(real, abs=0.05)
