"""Features: relative values comparable across GPU generations."""

from __future__ import annotations

import numpy as np

from processors.features import FEATURE_INDEX, features
from tests.unit.processors.history import Labelled


def test_features_of_the_fleet_are_relative(history: Labelled) -> None:
    batch = history.batches[0]
    f = features(batch.metrics, batch.relative, batch.gpu_model)
    assert np.nanmax(f[:, FEATURE_INDEX["power_ratio_of_limit"]]) <= 1.1
    assert np.nanmax(f[:, FEATURE_INDEX["pcie_rx_ratio_of_capacity"]]) < 1.0
