"""Learned baselines (see processors.baselines.score)."""

from processors.baselines.score import *  # noqa: F403
