"""Workload profiles: per application, the telemetry levels of each phase, the phase cycle and the job shapes.

Levels are fractions of the GPU's own capacity, so one profile fits every model: utilisation, DCGM SM / tensor /
DRAM activity, power as a fraction of the default power limit (the *demand*: a cap or the thermal controller may
hold the GPU below it), SM clock as a fraction of its maximum, PCIe traffic as a fraction of the trained link's
bandwidth per direction, NVLink traffic as a fraction of the GPU's NVLink bandwidth, InfiniBand as a fraction of
the NIC's rate.

Calibration (numbers and tests in docs/simulator.md):
- training power in the compute phase against Zeus (NSDI'23, ``summary_power_all_gpus.csv``, median
  ``average_power / power_limit`` at the default limit over V100, A40, RTX 6000): BERT-base 0.90, ResNet-50 0.87
  (P100 runs, 0.64-0.69, are an older generation that does not reach its limit and are left out);
- the LLM cluster mix (``MIXES["llm-a100"]``) against AcmeTrace's Seren/Kalos fleet quantiles of GPU utilisation,
  SM activity, framebuffer use, power and temperature (``tests/unit/producers/simulator/test_calibration.py``).
- signatures that tell applications apart the way real ones do: hashing is memory-bandwidth bound with a flat
  100 % utilisation, locked low core clock, small memory and no PCIe; Stable Diffusion serves bursts; LLM serving
  holds a large KV cache (vLLM preallocates 90 %) with load that follows the time of day; rendering runs the SM
  (not the tensor cores) flat out with PCIe bursts when a frame's scene loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline.events import APPLICATIONS, PHASES

#: columns of a level row
LEVELS: Final = ("util", "sm", "tensor", "dram", "power", "clock", "pcie_tx", "pcie_rx", "nvlink", "ib")
L_UTIL, L_SM, L_TENSOR, L_DRAM, L_POWER, L_CLOCK, L_PCIE_TX, L_PCIE_RX, L_NVLINK, L_IB = range(len(LEVELS))

PHASE_INDEX: Final = {p: i for i, p in enumerate(PHASES)}
P_COMPUTE, P_LOADING, P_CHECKPOINT, P_EVAL, P_IDLE = (PHASE_INDEX[p] for p in PHASES)
APP_INDEX: Final = {a: i for i, a in enumerate(APPLICATIONS)}
APP_IDLE: Final = APP_INDEX["idle"]

_QUIET = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Profile:
    """One application: levels per phase, how its phases cycle, what a job of it looks like.

    ``dynamics``: ``steady`` (training, rendering, hashing: levels plus small noise), ``serving`` (levels follow a
    request load between ``low`` and the compute row), ``bursty`` (on/off requests: compute row while a request
    runs, ``low`` between), ``interactive`` (a session holding a GPU, mostly doing nothing).
    Periodic phases are ``(every_min_s, every_max_s, length_min_s, length_max_s)``; None: the phase never occurs.
    """

    name: str
    phases: dict[str, tuple[float, ...]]
    low: tuple[float, ...]
    dynamics: str
    jitter: float
    loading: tuple[float, float, float, float] | None
    checkpoint: tuple[float, float, float, float] | None
    evaluation: tuple[float, float, float, float] | None
    #: GPUs per job -> weight
    sizes: tuple[tuple[int, float], ...]
    #: job length, seconds: lognormal median and sigma
    duration_median_s: float
    duration_sigma: float
    #: memory: (low, high) and unit "frac" (of the GPU's memory) or "gib"
    memory: tuple[float, float]
    memory_unit: str
    models: tuple[str, ...]
    frameworks: tuple[str, ...]
    #: process name per framework (NVML reports the executable)
    process: dict[str, str]
    #: how hard a job drives the GPU (model size, batch size, efficiency): a factor on SM/tensor/DRAM activity,
    #: power above idle and interconnect traffic, drawn per job from this range
    intensity: tuple[float, float] = (0.9, 1.1)

    @property
    def util(self) -> float:
        """Mean utilisation of the compute phase (what the old simple fleet called ``util``)."""
        return self.phases["compute"][L_UTIL]


def _p(
    name: str,
    compute: tuple[float, ...],
    *,
    loading: tuple[float, ...] | None = None,
    checkpoint: tuple[float, ...] | None = None,
    evaluation: tuple[float, ...] | None = None,
    low: tuple[float, ...] = _QUIET,
    dynamics: str = "steady",
    jitter: float = 0.03,
    every: dict[str, tuple[float, float, float, float]] | None = None,
    sizes: tuple[tuple[int, float], ...] = ((1, 1.0),),
    duration: tuple[float, float] = (7200.0, 0.8),
    memory: tuple[float, float] = (0.3, 0.6),
    memory_unit: str = "frac",
    models: tuple[str, ...] = (),
    frameworks: tuple[str, ...] = ("pytorch",),
    process: dict[str, str] | None = None,
    intensity: tuple[float, float] = (0.9, 1.1),
) -> Profile:
    every = every or {}
    phases = {"compute": compute, "idle": _QUIET}
    for phase, row in (("data-loading", loading), ("checkpoint", checkpoint), ("eval", evaluation)):
        if row is not None:
            phases[phase] = row
    return Profile(
        name,
        phases,
        low,
        dynamics,
        jitter,
        every.get("data-loading"),
        every.get("checkpoint"),
        every.get("eval"),
        sizes,
        duration[0],
        duration[1],
        memory,
        memory_unit,
        models,
        frameworks,
        process or dict.fromkeys(frameworks, "python"),
        intensity,
    )


_H = 3600.0
#        util  sm    tensor dram  power clock pcie_tx pcie_rx nvlink ib
PROFILES: Final[dict[str, Profile]] = {
    p.name: p
    for p in (
        _p(
            "llm-pretraining",
            (1.00, 0.80, 0.52, 0.42, 1.02, 0.96, 0.01, 0.01, 0.30, 0.35),
            # a stalled input pipeline on one rank holds every rank in a collective: NCCL kernels spin (utilisation
            # stays high, their CTAs keep about a third of the SMs busy) while power idles: the "busy but cold"
            # samples of AcmeTrace's LLM clusters
            loading=(0.99, 0.30, 0.02, 0.05, 0.22, 0.90, 0.01, 0.06, 0.03, 0.05),
            checkpoint=(0.12, 0.04, 0.00, 0.08, 0.24, 0.85, 0.40, 0.01, 0.01, 0.30),
            evaluation=(0.95, 0.45, 0.28, 0.35, 0.60, 0.95, 0.01, 0.01, 0.12, 0.08),
            every={
                "data-loading": (60, 240, 5, 40),
                "checkpoint": (1200, 2400, 40, 150),
                "eval": (1800, 3600, 90, 300),
            },
            jitter=0.02,
            duration=(2 * 24 * _H, 0.6),
            memory=(0.70, 0.95),
            intensity=(0.55, 1.1),
            models=("llama-3-70b", "llama-3-8b", "mixtral-8x7b", "gpt-neox-20b", "internlm-20b"),
            frameworks=("megatron-lm", "deepspeed", "pytorch"),
        ),
        _p(
            "llm-finetuning",
            (0.99, 0.70, 0.42, 0.40, 0.84, 0.95, 0.02, 0.03, 0.18, 0.0),
            loading=(0.40, 0.10, 0.02, 0.05, 0.30, 0.90, 0.01, 0.10, 0.02, 0.0),
            checkpoint=(0.10, 0.03, 0.00, 0.06, 0.22, 0.85, 0.35, 0.01, 0.00, 0.0),
            evaluation=(0.92, 0.42, 0.25, 0.33, 0.58, 0.95, 0.01, 0.01, 0.06, 0.0),
            every={"data-loading": (120, 300, 2, 8), "checkpoint": (900, 1800, 20, 60), "eval": (600, 1200, 60, 180)},
            sizes=((1, 0.3), (2, 0.2), (4, 0.25), (8, 0.25)),
            duration=(2.5 * _H, 0.7),
            memory=(0.45, 0.92),
            intensity=(0.3, 1.0),
            models=("llama-3-8b-lora", "mistral-7b", "qwen2-7b", "llama-3-70b-qlora"),
            frameworks=("pytorch", "deepspeed"),
        ),
        _p(
            "bert-training",
            (0.99, 0.74, 0.38, 0.45, 0.87, 0.96, 0.02, 0.06, 0.10, 0.0),
            loading=(0.45, 0.15, 0.05, 0.10, 0.35, 0.90, 0.01, 0.15, 0.01, 0.0),
            checkpoint=(0.10, 0.03, 0.00, 0.05, 0.22, 0.85, 0.20, 0.01, 0.00, 0.0),
            evaluation=(0.90, 0.50, 0.25, 0.40, 0.60, 0.95, 0.01, 0.04, 0.02, 0.0),
            every={"data-loading": (90, 240, 2, 6), "checkpoint": (1200, 2400, 10, 30), "eval": (600, 1200, 45, 120)},
            sizes=((1, 0.4), (2, 0.2), (4, 0.2), (8, 0.2)),
            duration=(1.5 * _H, 0.7),
            memory=(0.25, 0.60),
            models=("bert-base-uncased", "bert-large-uncased", "roberta-base"),
            frameworks=("pytorch", "tensorflow"),
        ),
        _p(
            "resnet-training",
            (0.93, 0.70, 0.30, 0.55, 0.87, 0.96, 0.02, 0.18, 0.08, 0.0),
            loading=(0.25, 0.08, 0.02, 0.06, 0.28, 0.90, 0.01, 0.25, 0.01, 0.0),
            checkpoint=(0.08, 0.02, 0.00, 0.04, 0.20, 0.85, 0.15, 0.01, 0.00, 0.0),
            evaluation=(0.85, 0.50, 0.20, 0.45, 0.58, 0.95, 0.01, 0.15, 0.02, 0.0),
            every={"data-loading": (30, 90, 2, 6), "checkpoint": (1200, 2400, 10, 30), "eval": (900, 1500, 60, 120)},
            jitter=0.04,
            sizes=((1, 0.4), (2, 0.2), (4, 0.2), (8, 0.2)),
            duration=(1.5 * _H, 0.7),
            memory=(0.20, 0.55),
            models=("resnet50", "resnet152", "efficientnet-b4"),
            frameworks=("pytorch", "tensorflow"),
        ),
        _p(
            "stable-diffusion-inference",
            (0.97, 0.86, 0.55, 0.50, 0.85, 0.97, 0.02, 0.01, 0.0, 0.0),
            low=(0.01, 0.0, 0.0, 0.01, 0.16, 0.55, 0.0, 0.0, 0.0, 0.0),
            dynamics="bursty",
            jitter=0.04,
            sizes=((1, 0.8), (2, 0.2)),
            duration=(10 * _H, 0.8),
            memory=(6.5, 14.0),
            memory_unit="gib",
            models=("stable-diffusion-xl", "sd-1.5", "sd-turbo"),
            frameworks=("diffusers", "comfyui"),
            process={"diffusers": "python", "comfyui": "python"},
        ),
        _p(
            "llm-serving",
            (0.98, 0.55, 0.30, 0.80, 0.70, 0.96, 0.01, 0.01, 0.15, 0.0),
            low=(0.04, 0.03, 0.01, 0.05, 0.20, 0.90, 0.002, 0.002, 0.0, 0.0),
            dynamics="serving",
            jitter=0.08,
            sizes=((1, 0.6), (2, 0.4)),
            duration=(3 * 24 * _H, 0.8),
            memory=(0.88, 0.92),
            models=("llama-3-8b-instruct", "llama-3-70b-instruct", "qwen2-7b-instruct", "mistral-7b-instruct"),
            frameworks=("vllm", "tgi"),
            process={"vllm": "vllm", "tgi": "text-generation-server"},
        ),
        _p(
            "rendering",
            (1.00, 0.92, 0.04, 0.35, 0.90, 0.97, 0.01, 0.02, 0.0, 0.0),
            loading=(0.15, 0.05, 0.00, 0.05, 0.30, 0.90, 0.02, 0.45, 0.0, 0.0),
            every={"data-loading": (40, 150, 4, 15)},
            jitter=0.02,
            duration=(2 * _H, 0.6),
            memory=(3.0, 18.0),
            memory_unit="gib",
            models=("blender-cycles", "blender-eevee"),
            frameworks=("blender",),
            process={"blender": "blender"},
        ),
        _p(
            "hashing",
            (1.00, 0.97, 0.00, 0.97, 0.72, 0.65, 0.0, 0.0, 0.0, 0.0),
            jitter=0.005,
            duration=(5 * 24 * _H, 0.5),
            memory=(4.2, 5.6),
            memory_unit="gib",
            intensity=(0.97, 1.02),
            models=("ethash", "kawpow"),
            frameworks=("xmrig", "lolminer"),
            process={"xmrig": "xmrig", "lolminer": "lolMiner"},
        ),
        # an interactive session (notebook) that holds a GPU and mostly does nothing: allocated, not used
        _p(
            "idle",
            (0.35, 0.20, 0.05, 0.10, 0.30, 0.85, 0.01, 0.02, 0.0, 0.0),  # a cell run now and then
            dynamics="interactive",
            jitter=0.0,
            duration=(1.5 * _H, 0.6),
            memory=(0.3, 3.0),
            memory_unit="gib",
            models=("notebook",),
            frameworks=("jupyter",),
            process={"jupyter": "python"},
        ),
    )
}

#: Applications that keep a GPU busy enough for thermal, power and PCIe faults to show (compute power >= 0.5)
BUSY_APPS: Final = frozenset(name for name, p in PROFILES.items() if p.phases["compute"][L_POWER] >= 0.5)
#: Applications whose multi-GPU jobs exchange gradients every step (stragglers and NVLink loss slow all peers)
SYNC_APPS: Final = frozenset({"llm-pretraining", "llm-finetuning", "bert-training", "resnet-training"})


def level_table() -> np.ndarray:
    """Levels as an array [application, phase, level] (zeros for applications without a profile)."""
    table = np.zeros((len(APPLICATIONS), len(PHASES), len(LEVELS)))
    for name, profile in PROFILES.items():
        for phase, row in profile.phases.items():
            table[APP_INDEX[name], PHASE_INDEX[phase]] = row
    return table


def low_table() -> np.ndarray:
    """The ``low`` row per application: levels between requests (bursty) or at zero load (serving)."""
    table = np.zeros((len(APPLICATIONS), len(LEVELS)))
    for name, profile in PROFILES.items():
        table[APP_INDEX[name]] = profile.low
    return table


def jitter_table() -> np.ndarray:
    out = np.zeros(len(APPLICATIONS))
    for name, profile in PROFILES.items():
        out[APP_INDEX[name]] = profile.jitter
    return out
