"""The peer-comparison straggler function on real step times (Alibaba PAI 2020, tests/testdata) and on edge cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.face.evaluation import PAI_LABELS, PAI_WINDOW, pai_result, pai_step_windows
from processors.detectors.stragglers import PeerState, StragglerParams, pair_scores, peer_step, scan

DATA = Path(__file__).parents[3] / "testdata" / "alibaba-pai2020-minibatch-stragglers"


def windows(job: int) -> np.ndarray:
    return pai_step_windows(DATA / f"job_{job}_norm.csv")


@pytest.mark.parametrize("job", sorted(PAI_LABELS))
def test_pai_stragglers_are_the_labelled_workers(job: int) -> None:
    result = pai_result(job, scan(windows(job), StragglerParams()))
    assert result.ok, result


def test_pai_job1_straggler_only_in_the_middle() -> None:
    """Worker 6 emerges around time 1,800-2,100 and recovers: flagged there and nowhere else."""
    flags = scan(windows(1), StragglerParams())
    flagged_from = np.flatnonzero(flags[6]) * PAI_WINDOW
    assert flagged_from.size and flagged_from.min() >= 1700 and flagged_from.max() <= 2200


def test_pai_job4_fluctuating_stragglers_are_one_episode_each() -> None:
    flags = scan(windows(4), StragglerParams())
    for w in PAI_LABELS[4]:
        starts = np.count_nonzero(flags[w, 1:] & ~flags[w, :-1]) + int(flags[w, 0])
        assert starts <= 3, f"worker {w} flapped {starts} times"


def test_faster_workers_are_never_stragglers() -> None:
    rng = np.random.default_rng(1)
    steps = 100 + rng.normal(0, 1, (8, 40))
    steps[2] *= 0.5  # twice as fast
    assert not scan(steps, StragglerParams()).any()


def test_emerging_straggler_is_caught_and_clears() -> None:
    rng = np.random.default_rng(2)
    steps = 100 + rng.normal(0, 1, (8, 60))
    steps[5, 20:40] *= 1.15  # 15% slower for 20 windows
    flags = scan(steps, StragglerParams())
    # caught within the persistence span, cleared within persistence/2 + clear windows after it ends
    assert flags[5, 30] and not flags[5, :20].any() and not flags[5, 48:].any()
    assert not np.delete(flags, 5, axis=0).any()


def test_missing_workers_do_not_break_the_window() -> None:
    steps = np.full((6, 20), 100.0)
    steps[1, ::2] = np.nan  # reports every other window
    steps[4] = 150.0
    flags = scan(steps, StragglerParams())
    assert flags[4].any() and not np.delete(flags, 4, axis=0).any()


def test_flag_rate_on_the_dispersion_of_100_real_jobs() -> None:
    """Calibration on the spread measured in 100 PAI jobs (coefficient of variation of the 10 workers' step time at
    every iteration): synthetic jobs whose workers are i.i.d. with exactly that spread have no structural straggler,
    so where the real spread is moderate (median CoV < 0.1: 53 of the 100 jobs) flags must be rare. Jobs with a
    median CoV of 0.5-3 are flagged: a spread that large comes from slow workers. The rates go to docs/detectors.md."""
    table = pq.read_table(DATA / "coefficient_variation_long.parquet")
    jobs = np.array(table.column("job").to_pylist())
    cov = table.column("cov").to_numpy()
    rng = np.random.default_rng(0)
    params = StragglerParams()
    median_cov, rate = [], []
    for job in np.unique(jobs):
        c = cov[jobs == job]
        c = c[np.isfinite(c)]
        steps = 1.0 + rng.standard_normal((10, c.size)) * c
        k = c.size // 10
        flags = scan(np.median(steps[:, : k * 10].reshape(10, k, 10), axis=2), params)
        median_cov.append(float(np.median(c)))
        rate.append(float(flags.mean()))
    m, r = np.array(median_cov), np.array(rate)
    for lo, hi in ((0, 0.05), (0.05, 0.1), (0.1, 0.2), (0.2, 0.5), (0.5, np.inf)):
        band = (m >= lo) & (m < hi)
        print(f"median CoV {lo}-{hi}: {band.sum()} jobs, {r[band].mean():.2%} of worker-windows flagged")
    moderate = m < 0.1
    assert moderate.sum() >= 50
    assert r[moderate].mean() < 0.01


def test_a_pair_is_judged_by_the_excess_over_the_faster_one() -> None:
    params = StragglerParams()
    steps = np.array([[1.0, 1.0, 1.0], [1.35, 1.05, np.nan]])  # 35% and 5% slower, then the pair's one left
    rel, z, fastest = pair_scores(steps[:, 0], params)
    assert fastest == 1.0 and rel.tolist() == pytest.approx([0.0, 0.35]) and z[1] == pytest.approx(7.0)
    state = PeerState.empty(2, params)
    state, verdict = peer_step(state, steps[:, 0], params)
    assert verdict.judged and verdict.active.tolist() == [False, True]  # acute: 35% at once
    state, verdict = peer_step(state, steps[:, 1], params)
    assert verdict.rel[1] == pytest.approx(0.05)
    _, alone = peer_step(state, steps[:, 2], params)
    assert not alone.judged  # one worker: nothing to compare with
    off = StragglerParams(pair_rel=0.0)
    assert not peer_step(PeerState.empty(2, off), steps[:, 0], off)[1].judged
