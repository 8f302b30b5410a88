"""Simulated GPU fleets for development, tests and benchmarks where no GPU is present."""

from producers.simulator.fleet import MODELS, PROFILES, Fleet, GpuModel, Profile

__all__ = ["MODELS", "PROFILES", "Fleet", "GpuModel", "Profile"]
