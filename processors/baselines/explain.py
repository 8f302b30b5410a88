"""The one line that explains a verdict: what is off, against which baseline (application, GPU model, phase), and a
hint when the GPU says why (NVML's clock-event reasons)."""

from __future__ import annotations

from typing import Final

import numpy as np

from pipeline.events import Driver, Verdict, Workload
from pipeline.vocab import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_POWER_CAP, SW_THERMAL
from processors.baselines.model import FLEET, Baseline
from processors.features import FEATURE_INDEX, FEATURES

APPLICATION_LABELS: Final[dict[str, str]] = {
    "llm-pretraining": "LLM pre-training",
    "llm-finetuning": "LLM fine-tuning",
    "llm-serving": "LLM serving",
    "bert-training": "BERT training",
    "resnet-training": "ResNet training",
    "stable-diffusion-inference": "Stable Diffusion inference",
    "rendering": "rendering",
    "hashing": "hashing",
    "idle": "an idle GPU",
}

# NVML clocks-event reasons that hold clocks down, and what an operator should do about them
_THROTTLE_HINTS: Final = (
    (HW_THERMAL | SW_THERMAL, "clocks held by thermal slowdown: check cooling"),
    (HW_SLOWDOWN, "clocks held by HW slowdown: check cooling and power delivery"),
    (HW_POWER_BRAKE, "clocks held by the power brake: check the PSU/board"),
    (SW_POWER_CAP, "clocks held by the power cap"),
)


def _pct(feature: str, value: float) -> str:
    spec = FEATURES[FEATURE_INDEX[feature]]
    percent = value if spec.unit == "percent" else value * 100
    return f"{percent:.1f}%" if 0 < abs(percent) < 1 else f"{percent:.0f}%"


def _phrase(feature: str, value: float, memory_total_bytes: float) -> str:
    spec = FEATURES[FEATURE_INDEX[feature]]
    shown = _pct(feature, value)
    if feature == "power_ratio_of_limit":
        return f"power {shown} of limit"
    if feature == "memory_used_ratio":
        of = f"{memory_total_bytes / 2**30:.0f} GB" if memory_total_bytes == memory_total_bytes else "total"  # noqa: PLR0124
        return f"memory {shown} of {of}"
    if feature == "sm_clock_ratio_of_max":
        return f"SM clock {shown} of max"
    if feature == "temperature_ratio_of_slowdown":
        return f"temperature {shown} of slowdown"
    if spec.unit == "ratio":
        return f"{spec.label} {shown} of link capacity"
    return f"{spec.label} {shown}"


def short_model(gpu_model: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100 80GB HBM3``: what people call the board."""
    for prefix in ("NVIDIA GeForce ", "NVIDIA ", "GeForce ", "Tesla "):
        if gpu_model.startswith(prefix):
            return gpu_model[len(prefix) :]
    return gpu_model


def _judged_against(b: Baseline, workload: Workload | None, gpu_model: str) -> str:
    app = b.record.application
    if app == FLEET:
        what = "this fleet"
    else:
        what = APPLICATION_LABELS.get(app, app)
        if workload is not None and workload.source == "inferred":
            what += f" (inferred, {workload.confidence:.0%})"
    on = f"on {short_model(gpu_model)}" if b.record.gpu_model is not None else "on any GPU model"
    return f"{what} {on} in {b.record.phase}"


def support(b: Baseline, strong: bool) -> str:
    """How much history stood behind a verdict, in words (every explanation says what it was judged against)."""
    r = b.record
    learned = f"{r.n:,} samples" + (f" on {r.gpus} GPUs" if r.gpus else "")
    if strong:
        return f"learned from {learned}"
    whose = "another cluster's or too few GPUs'" if r.gpu_model is not None else "pooled over GPU models"
    return f"a prior ({learned}, {whose}), beyond the public bands of healthy GPUs: it widens the band, never condemns"


def explain(
    verdict: Verdict,
    drivers: tuple[Driver, ...],
    f_row: np.ndarray,
    b: Baseline,
    workload: Workload | None,
    gpu_model: str,
    memory_total_bytes: float,
    throttle_mask: float,
    strong: bool = True,
) -> str:
    """One line a person can act on: what is off, against which baseline (and how much history it had), and a hint
    when the GPU says why."""
    against = _judged_against(b, workload, gpu_model)
    history = support(b, strong)
    if not drivers:
        return f"unusual combination of values: {verdict.value} for {against} ({history})"
    parts = []
    for d in drivers[:2]:
        bound = f"p5 {_pct(d.feature, d.low)}" if d.observed < d.low else f"p95 {_pct(d.feature, d.high)}"
        parts.append((_phrase(d.feature, d.observed, memory_total_bytes), bound))
    named = {d.feature for d in drivers}
    context = ""
    for feature in ("sm_active_percent", "utilization_gpu_percent"):
        value = f_row[FEATURE_INDEX[feature]]
        if feature in named:
            break
        if value == value:  # noqa: PLR0124 (present)
            context = f" while {_phrase(feature, float(value), memory_total_bytes)}"
            break
    text = f"{parts[0][0]}{context}: {verdict.value} for {against} ({parts[0][1]}; {history})"
    if len(parts) > 1:
        text += f"; {parts[1][0]} ({parts[1][1]})"
    if throttle_mask == throttle_mask:  # noqa: PLR0124
        mask = int(throttle_mask)
        for bits, hint in _THROTTLE_HINTS:
            if mask & bits:
                text += f"; {hint}"
                break
    return text
