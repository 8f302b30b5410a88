"""Right-sizing advice: from a job's (or an application's) measured usage, the smaller slice of GPU it needs, and the
forum thread's three questions answered for it.

Pure: :class:`pipeline.usage.UsageStats` in, :class:`Recommendation` out. What a job *needs*:

- memory: its p99 memory plus ``headroom`` (20%), and never less than its peak plus 5% (the peak happened);
- compute: its p95 SM activity (DCGM; utilization when SM activity is not reported, which overstates need:
  utilization counts a kernel on one SM as busy) plus the same headroom.

``used_share`` is the larger of the two as a share of the GPU it ran on. ``wasted_gpu_hours`` is one definition of
waste, the one the idle-capacity finding and ``top wasted`` count too: the GPU-hours the job held its GPUs idle
(under ``pipeline.vocab.IDLE_UTIL_PERCENT``), plus, of the hours it computed, the share of the GPU it did not need.
GPU-hours are ``pipeline.usage``'s (never weighted by board power). The options, best saving first:

- ``release``: a job idle for a quarter or more of the time it held its GPUs gives them back between its phases
  (or asks for shorter allocations): it saves its idle GPU-hours;
- ``mig``: the smallest MIG profile of its GPU model (catalogue ``mig_profiles``) with enough memory and compute
  slices (its share of the board's SMs >= compute need): saves the rest of the board's GPU-hours;
- ``pack``: N such jobs on one GPU (MPS or time-slicing) when memory and compute leave room for 2 or more;
- ``smaller-gpu``: the catalogue's smallest GPU of the same class (data-centre or not) with enough memory and a
  board power of at least the job's p95 draw plus headroom (power is the catalogue's one cross-generation proxy
  for compute class). One GPU for one GPU: it saves no GPU-hours, it frees the big board (a trade, said so);
- ``split``: when no smaller GPU holds the model, k smaller GPUs holding 1/k of it each. Memory is read per GPU,
  so every GPU held becomes k smaller ones: k times the GPU-hours, never a saving, shown as the trade it is (the
  big boards it frees, the GPU-hours and the time per step on the link between them, :func:`split_costs`);
- ``keep`` when the job uses at least ``keep_share`` (60%) of its GPU.

**What a split costs** (the thread's third question): each parallelism kind moves its bytes over the link between
the GPUs, and every hand-off pays the link's latency and the overhead of issuing and synchronising the copy:
``extra = bytes / bandwidth + hops x latency + hops x overhead`` (:func:`split_cost`):

- ``pipeline`` (layers cut over k GPUs): k-1 cuts, one activation (tokens x hidden x dtype per sequence) handed on
  per cut per forward pass, and back once in training (:func:`pipeline_split`);
- ``tensor`` (each layer's matrices over k GPUs): two ring all-reduces of the activations per layer (attention and
  MLP, as Megatron-LM cuts them), each moving 2(k-1)/k of the bytes in 2(k-1) hops (:func:`tensor_split`);
- ``data`` (a replica per GPU): one ring all-reduce of the gradients per step (:func:`data_split`).

The bytes come from the model's dimensions (``pipeline.catalogue.MODELS`` or ``--model-dims``), else from the
job's measured NVLink/PCIe traffic (bytes per second of run: the transfer term only, the hops unknown), and the
answer says which. The link figures come from the fleet (the probe's ``LinkTiming`` on the topology topic), else
from the published measurements in ``pipeline.catalogue.PUBLISHED_LINKS``, and say which.

Options are ranked by GPU-hours saved; MIG is preferred when it saves within one slice (1/7) of packing, for its
isolation. Trades (no GPU-hours saved) come after savings, a split last.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from pipeline.catalogue import PUBLISHED_LINKS, SPECS, GpuSpec, LinkFigures, ModelDims, lookup
from pipeline.topology import LinkTiming
from pipeline.usage import UsageStats
from pipeline.vocab import IDLE_UTIL_PERCENT

#: per-lane PCIe throughput per direction (GB/s) after line coding, by generation
PCIE_LANE_GBYTES: Final = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
#: a job idle for at least this share of the GPU-hours it held is told to give its GPUs back between phases
RELEASE_SHARE: Final = 0.25
#: the most GPUs a split is offered over
MAX_SPLIT: Final = 8
PARALLELISMS: Final = ("pipeline", "tensor", "data")


@dataclass(frozen=True, slots=True)
class Link:
    """The path between the GPUs of a split: kind, usable bandwidth per direction, one-way latency, the overhead of
    issuing and synchronising one copy, and where the numbers are from."""

    kind: str
    bytes_per_second: float
    latency_s: float
    source: str
    overhead_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SplitCost:
    """The extra time per step of one parallelism kind over ``k`` GPUs on ``link``, with the terms that make it:
    ``bytes_moved`` through the busiest link and ``hops`` hand-offs, each paying latency and overhead."""

    parallelism: str
    k: int
    link: Link
    bytes_moved: float
    hops: int
    #: where the bytes are from: a catalogue model, --model-dims, or the job's measured traffic
    bytes_from: str

    @property
    def transfer_s(self) -> float:
        return self.bytes_moved / self.link.bytes_per_second

    @property
    def latency_s(self) -> float:
        return self.hops * self.link.latency_s

    @property
    def overhead_s(self) -> float:
        return self.hops * self.link.overhead_s

    @property
    def total_s(self) -> float:
        return self.transfer_s + self.latency_s + self.overhead_s

    @property
    def per_added_gpu_s(self) -> float:
        """What each GPU beyond the first adds (the costs grow with k-1 hops; a ring's bytes nearly so)."""
        return self.total_s / max(1, self.k - 1)

    def terms(self) -> str:
        return (
            f"{_ms(self.transfer_s)} moving {_bytes(self.bytes_moved)} at {self.link.bytes_per_second / 1e9:.1f} GB/s"
            f" + {self.hops} x {self.link.latency_s * 1e6:.1f} us latency + {self.hops} x "
            f"{self.link.overhead_s * 1e6:.1f} us overhead"
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _bytes(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def split_cost(parallelism: str, k: int, link: Link, bytes_moved: float, hops: int, bytes_from: str) -> SplitCost:
    """bytes / bandwidth + hops x latency + hops x overhead (module docstring); nothing for one GPU."""
    if k < 2:
        return SplitCost(parallelism, k, link, 0.0, 0, bytes_from)
    return SplitCost(parallelism, k, link, bytes_moved, hops, bytes_from)


def pipeline_split(
    dims: ModelDims, tokens: int, k: int, link: Link, batch: int = 1, training: bool = False, bytes_from: str = ""
) -> SplitCost:
    """Layers cut over k GPUs: k-1 hand-offs of one activation per forward pass (twice in training: the gradient
    of the activation comes back), one after the other, so their times add."""
    passes = 2 if training else 1
    hand_offs = (k - 1) * passes
    return split_cost(
        "pipeline",
        k,
        link,
        hand_offs * dims.activation_bytes(tokens, batch),
        hand_offs,
        bytes_from or f"model {dims.name}",
    )


def _ring(nbytes: float, k: int) -> tuple[float, int]:
    """A ring all-reduce of ``nbytes`` over k GPUs: 2(k-1)/k of it through each link, in 2(k-1) steps."""
    return 2 * (k - 1) / k * nbytes, 2 * (k - 1)


def tensor_split(
    dims: ModelDims, tokens: int, k: int, link: Link, batch: int = 1, training: bool = False, bytes_from: str = ""
) -> SplitCost:
    """Each layer over k GPUs: two all-reduces of the layer's activations per forward pass (four in training)."""
    reductions = dims.layers * (4 if training else 2)
    moved, hops = _ring(dims.activation_bytes(tokens, batch), k)
    return split_cost("tensor", k, link, reductions * moved, reductions * hops, bytes_from or f"model {dims.name}")


def data_split(dims: ModelDims, k: int, link: Link, bytes_from: str = "") -> SplitCost:
    """A replica per GPU: one all-reduce of the gradients per step (a training job's; inference exchanges none)."""
    moved, hops = _ring(dims.gradient_bytes(), k)
    return split_cost("data", k, link, moved, hops, bytes_from or f"model {dims.name}")


def traffic_split(bytes_per_second: float, k: int, link: Link, what: str) -> SplitCost:
    """From the job's measured traffic (bytes per second of run, the p99 minute): the time per second of run its
    bytes would take on ``link``; the hops are unknown, so latency and overhead are not counted (said)."""
    return split_cost("measured", k, link, bytes_per_second, 0, f"measured {what} traffic (per second of run)")


def split_costs(
    dims: ModelDims | None, k: int, link: Link, tokens: int, training: bool, stats: UsageStats | None = None
) -> list[SplitCost]:
    """The costs the evidence supports: per parallelism kind from the model's dimensions (data parallelism only in
    training), else from the job's measured NVLink or PCIe traffic, else none (the caller says what is missing)."""
    if dims is not None:
        costs = [
            pipeline_split(dims, tokens, k, link, training=training),
            tensor_split(dims, tokens, k, link, training=training),
        ]
        return costs + ([data_split(dims, k, link)] if training else [])
    if stats is not None and stats.nvlink_p99_bytes_per_second:
        return [traffic_split(stats.nvlink_p99_bytes_per_second, k, link, "NVLink")]
    if stats is not None and stats.pcie_p99_bytes_per_second:
        return [traffic_split(stats.pcie_p99_bytes_per_second, k, link, "PCIe")]
    return []


# --- links: measured on the fleet, else published -----------------------------------------------------------------


def catalogue_link(spec: GpuSpec) -> Link:
    """What the catalogue says about a model's link to its peers: NVLink if it has any, else its PCIe link (peer
    copies on data-centre boards; host-staged on others, which have no peer access), with the published latency
    and overhead of that kind."""
    if spec.nvlink_links and spec.nvlink_gbytes_per_second:
        f = PUBLISHED_LINKS["nvlink"]
        return Link(
            "nvlink", spec.nvlink_links * spec.nvlink_gbytes_per_second * 1e9, f.latency_s, f.source, f.overhead_s
        )
    if not spec.data_center:
        f = PUBLISHED_LINKS["pcie-staged"]
        return Link(f.kind, f.bytes_per_second, f.latency_s, f.source, f.overhead_s)
    per_lane = PCIE_LANE_GBYTES.get(spec.pcie_gen_max or 3, 0.985)
    f = PUBLISHED_LINKS["pcie"]
    rate = f"PCIe {spec.pcie_gen_max} x{spec.pcie_width_max} rate (catalogue); {f.source}"
    return Link("pcie", per_lane * (spec.pcie_width_max or 16) * 1e9, f.latency_s, rate, f.overhead_s)


def published_link(figures: LinkFigures) -> Link:
    return Link(figures.kind, figures.bytes_per_second, figures.latency_s, figures.source, figures.overhead_s)


def measured_links(timings: Iterable[LinkTiming]) -> dict[str, Link]:
    """The probe's readings per link kind: for each kind, the median pair of the GPU-to-GPU paths a framework would
    use (``d2d``, a peer copy, staged by the driver where there is no peer access); the host-only CPU path is no
    link between GPUs and is left out."""
    by_kind: dict[str, list[LinkTiming]] = {}
    for t in timings:
        if t.path == "d2d" and t.kind != "host":
            by_kind.setdefault(t.kind, []).append(t)
    out = {}
    for kind, found in by_kind.items():
        mid = sorted(found, key=lambda t: t.latency_s + t.overhead_s)[len(found) // 2]
        source = f"probe: {len(found)} GPU pair(s), median {mid.a}->{mid.b} ({mid.source})"
        out[kind] = Link(kind, mid.bytes_per_second, mid.latency_s, source, mid.overhead_s)
    return out


def fleet_links(kinds: Iterable[str], measured: Mapping[str, Link]) -> dict[str, Link]:
    """A link per kind the fleet has: the probe's where it measured that kind, else the published figures."""
    return {
        k: measured.get(k) or published_link(PUBLISHED_LINKS[k]) for k in sorted(set(kinds)) if k in PUBLISHED_LINKS
    }


# --- the advice ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Option:
    kind: str
    target: str
    #: share of the job's current GPU-hours this option would still use (more than 1: it uses more)
    share: float
    #: GPU-hours saved (pipeline.usage's); 0 or less: not a saving but a trade, said in ``detail``
    saved_gpu_hours: float
    detail: str
    extra_step_s: float | None = None


@dataclass(frozen=True, slots=True)
class Answers:
    """The thread's three questions for one job: the smallest GPU or MIG profile that holds it; how many GPUs of
    each smaller size a split needs; what each added GPU costs on each link kind the fleet has (terms included)."""

    smallest: str
    smallest_detail: str
    #: (GPU, how many hold it), smallest GPU first; only models that alone do not hold it
    splits: tuple[tuple[str, int], ...]
    #: the split the costs are for ("" when no split is needed or none fits in MAX_SPLIT GPUs)
    priced: str
    costs: tuple[SplitCost, ...]
    #: why no cost is given, or what it rests on
    cost_note: str


@dataclass(frozen=True, slots=True)
class Recommendation:
    stats: UsageStats
    used_share: float
    wasted_gpu_hours: float
    options: tuple[Option, ...]
    summary: str
    evidence: dict[str, float] = field(default_factory=dict)
    answers: Answers | None = None


def recommend(
    stats: UsageStats,
    headroom: float = 0.2,
    keep_share: float = 0.6,
    model: ModelDims | None = None,
    tokens: int = 512,
    training: bool | None = None,
    links: Mapping[str, Link] | None = None,
    measured: Mapping[str, Link] | None = None,
) -> Recommendation:
    """The advice for one job or application (module docstring). ``model``: the dimensions a split is priced from
    (else the job's measured traffic); ``tokens``: per sequence; ``training``: whether the job trains (default: its
    application's name says so); ``links``: a :class:`Link` per link kind the fleet has (default: every published
    kind); ``measured``: a GPU model's best link throughput seen on the fleet (else the catalogue's)."""
    spec = lookup(stats.gpu_model)
    total = None if math.isnan(stats.memory_total_bytes) else stats.memory_total_bytes
    if total is None and spec is not None:
        total = float(spec.memory_bytes)
    mem_need = max(stats.memory_p99_bytes * (1 + headroom), stats.memory_peak_bytes * 1.05)
    activity = stats.sm_active_p95_percent if stats.sm_active_p95_percent is not None else stats.utilization_p95_percent
    compute_need = min(1.0, activity / 100 * (1 + headroom))
    mem_share = min(1.0, mem_need / total) if total else 1.0
    used = max(mem_share, compute_need)
    idle = min(stats.idle_gpu_hours, stats.gpu_hours)
    wasted = idle + (stats.gpu_hours - idle) * (1 - used)
    trains = training if training is not None else "train" in (stats.application or "")
    fleet = dict(links) if links is not None else {k: published_link(f) for k, f in PUBLISHED_LINKS.items()}
    options: list[Option] = []
    if stats.gpu_hours and idle / stats.gpu_hours >= RELEASE_SHARE:
        share = idle / stats.gpu_hours
        what = f"idle (under {IDLE_UTIL_PERCENT:g}% utilization) for {share:.0%} of the time it held its GPUs"
        advice = "give them back between phases, or allocate for less time"
        options.append(Option("release", stats.gpu_model, 1 - share, idle, f"{what}: {advice}"))
    if used >= keep_share:
        options.append(Option("keep", stats.gpu_model, 1.0, 0.0, f"uses {used:.0%} of its GPU when it computes"))
    else:
        options += _mig(stats, spec, mem_need, compute_need)
        options += _pack(stats, mem_share, compute_need)
        options += _smaller(stats, spec, mem_need)
    if compute_need < keep_share and not any(o.kind == "smaller-gpu" for o in options):
        # memory-bound and compute-light: the model could be spread over smaller GPUs, at a price per step
        options += _split(stats, spec, mem_need, model, tokens, trains, measured or {})
    # savings first (MIG wins within one slice of packing: it isolates memory and faults, MPS/time-slicing does
    # not), then trades, a split last
    options.sort(
        key=lambda o: (
            o.kind == "split",
            o.saved_gpu_hours <= 0 and o.kind != "keep",
            -o.saved_gpu_hours - (stats.gpu_hours / 7 if o.kind == "mig" else 0),
        )
    )
    if not options:
        options.append(Option("keep", stats.gpu_model, 1.0, 0.0, "no smaller fit in the catalogue"))
    offered = next((o.target for o in options if o.kind == "split"), None)
    answers = answer(stats, spec, mem_need, compute_need, model, tokens, trains, fleet, offered)
    best = options[0]
    what = f"{stats.scope} {stats.key}" + (
        f" ({stats.application})" if stats.scope == "job" and stats.application else ""
    )
    summary = (
        f"{what} on {stats.gpus} x {stats.gpu_model}: uses {used:.0%} of its GPU(s) (memory p99 "
        f"{stats.memory_p99_bytes / 2**30:.1f} GiB, peak {stats.memory_peak_bytes / 2**30:.1f} GiB, "
        f"{'SM active' if stats.sm_active_p95_percent is not None else 'util'} p95 {activity:.0f}%, power p95 "
        f"{'not reported' if stats.power_p95_watts is None else f'{stats.power_p95_watts:.0f} W'}); {wasted:.1f} of "
        f"{stats.gpu_hours:.1f} GPU-hours wasted ({idle:.1f} idle) -> "
        f"{best.kind}: {best.target} ({best.detail})"
    )
    evidence = {
        "gpu_hours": stats.gpu_hours,
        "wasted_gpu_hours": wasted,
        "idle_gpu_hours": idle,
        "used_share": used,
        "memory_need_bytes": mem_need,
        "compute_need": compute_need,
        "memory_p99_bytes": stats.memory_p99_bytes,
        "memory_peak_bytes": stats.memory_peak_bytes,
    }
    if stats.power_p95_watts is not None:
        evidence["power_p95_watts"] = stats.power_p95_watts
    return Recommendation(stats, used, wasted, tuple(options), summary, evidence, answers)


def answer(
    stats: UsageStats,
    spec: GpuSpec | None,
    mem_need: float,
    compute_need: float,
    model: ModelDims | None,
    tokens: int,
    training: bool,
    links: Mapping[str, Link],
    offered: str | None = None,
) -> Answers:
    """The three questions (see :class:`Answers`) for a job needing ``mem_need`` bytes and ``compute_need`` of its
    GPU's SMs. Smaller GPUs are :func:`_smaller_boards`; the split priced is the one the options ``offered``, else
    the one over the fewest GPUs, of the largest such board."""
    if spec is None:
        unknown = "not in the catalogue: no smaller size known"
        return Answers(stats.gpu_model, "not in the catalogue", (), "", (), unknown)
    smaller = _smaller_boards(spec)
    holders = [s for s in smaller if s.memory_bytes >= mem_need]
    # a MIG profile of the whole board (7g) is the board: not a smaller size
    mig = [p for p in spec.mig_profiles if p.memory_bytes >= mem_need and compute_need <= p.compute_share < 1]
    smallest, detail = stats.gpu_model, f"needs {mem_need / 2**30:.1f} GiB: no smaller GPU of its class holds it"
    if mig:
        p = min(mig, key=lambda p: (p.memory_bytes, p.compute_share))
        smallest, detail = (
            f"{stats.gpu_model} MIG {p.name}",
            f"{p.memory_bytes / 2**30:.1f} GiB, {p.slices}/{p.of} of the SMs",
        )
    if holders and (not mig or holders[0].memory_bytes < min(p.memory_bytes for p in mig)):
        smallest, detail = (
            holders[0].name,
            f"{holders[0].memory_bytes / 2**30:.0f} GiB holds {mem_need / 2**30:.1f} GiB",
        )
    splits = tuple(
        (s.name, k)
        for s in smaller
        if s not in holders and 2 <= (k := math.ceil(mem_need / s.memory_bytes)) <= MAX_SPLIT
    )
    if not splits:
        note = f"no split needed: {smallest} holds it" if holders or mig else f"no split within {MAX_SPLIT} GPUs"
        return Answers(smallest, detail, (), "", (), note)
    # the split the options offer (a board of the job's power class), else the fewest GPUs of the largest board
    name, k = next(
        ((n, k) for n, k in splits if f"{k} x {n}" == offered),
        max(splits, key=lambda nk: (-nk[1], next(s.memory_bytes for s in smaller if s.name == nk[0]))),
    )
    costs = tuple(c for link in links.values() for c in split_costs(model, k, link, tokens, training, stats))
    if costs:
        note = f"bytes from {costs[0].bytes_from}; {tokens} tokens per sequence" if model else costs[0].bytes_from
    else:
        fixed = ", ".join(f"{kind} {(lk.latency_s + lk.overhead_s) * 1e6:.0f} us" for kind, lk in links.items())
        note = (
            "no model dimensions (--model / --model-dims) and no measured link traffic: per hand-off, latency + "
            f"overhead alone: {fixed}"
        )
    return Answers(smallest, detail, splits, f"{k} x {name}", costs, note)


def _mig(stats: UsageStats, spec: GpuSpec | None, mem_need: float, compute_need: float) -> list[Option]:
    if spec is None or not spec.mig_profiles:
        return []
    fitting = [p for p in spec.mig_profiles if p.memory_bytes >= mem_need and p.compute_share >= compute_need]
    if not fitting:
        return []
    best = min(fitting, key=lambda p: (p.compute_share, p.memory_bytes, "+me" in p.name))
    if best.compute_share >= 1:
        return []
    share = best.compute_share
    return [
        Option(
            "mig",
            best.name,
            share,
            stats.gpu_hours * (1 - share),
            f"{best.memory_bytes / 2**30:.0f} GiB and {best.slices}/{best.of} of the SMs hold it; "
            f"{best.of // best.slices} such instances per GPU",
        )
    ]


def _pack(stats: UsageStats, mem_share: float, compute_need: float) -> list[Option]:
    per_gpu = math.floor(min(1 / max(mem_share, 1e-9), 1 / max(compute_need, 1e-9)))
    if per_gpu < 2:
        return []
    share = 1 / per_gpu
    return [
        Option(
            "pack",
            f"{per_gpu} jobs per GPU",
            share,
            stats.gpu_hours * (1 - share),
            f"memory {mem_share:.0%} and compute {compute_need:.0%} of one GPU each (MPS or time-slicing)",
        )
    ]


def _vendor(spec: GpuSpec) -> str:
    return "AMD" if spec.name.startswith("AMD") else "NVIDIA"


def _smaller_boards(spec: GpuSpec) -> list[GpuSpec]:
    """The catalogue's boards of the same class (data-centre or not) and vendor (a CUDA job does not move to ROCm
    by being resized) with less memory, smallest first."""
    return sorted(
        (
            s
            for s in SPECS
            if s.data_center == spec.data_center and _vendor(s) == _vendor(spec) and s.memory_bytes < spec.memory_bytes
        ),
        key=lambda s: (s.memory_bytes, s.name),
    )


def _candidates(stats: UsageStats, spec: GpuSpec) -> list[GpuSpec]:
    """Smaller GPUs (:func:`_smaller_boards`) with enough board power for the job's p95 draw plus headroom (any
    board power, when the source reports no power)."""
    power_need = 0.0 if stats.power_p95_watts is None else stats.power_p95_watts * 1.2
    return [
        s
        for s in _smaller_boards(spec)
        if s.power_default_watts is not None
        and spec.power_default_watts is not None
        and spec.power_default_watts > s.power_default_watts >= power_need
    ]


def _smaller(stats: UsageStats, spec: GpuSpec | None, mem_need: float) -> list[Option]:
    """One smaller GPU per GPU held: the same GPU-hours on a smaller board, a trade that frees the big one."""
    if spec is None or spec.power_default_watts is None:
        return []
    fits = [s for s in _candidates(stats, spec) if s.memory_bytes >= mem_need]
    if not fits:
        return []
    best = min(fits, key=lambda s: (s.memory_bytes, s.power_default_watts or 0))
    return [
        Option(
            "smaller-gpu",
            best.name,
            1.0,
            0.0,
            f"{best.memory_bytes / 2**30:.0f} GiB holds {mem_need / 2**30:.1f} GiB; the same {stats.gpu_hours:.1f} "
            f"GPU-hours on a smaller board, frees the {spec.name}",
        )
    ]


def _split(
    stats: UsageStats,
    spec: GpuSpec | None,
    mem_need: float,
    model: ModelDims | None,
    tokens: int,
    training: bool,
    measured: Mapping[str, Link],
) -> list[Option]:
    """The model over k smaller GPUs, the fewest first. Memory is read per GPU, so each GPU the job holds becomes
    k smaller ones: k x its GPU-hours at best (a split only adds time per step), never a saving; the detail states
    the trade (the big boards it frees, the GPU-hours and time per step it costs)."""
    if spec is None:
        return []
    out: list[tuple[int, int, Option]] = []
    for s in _candidates(stats, spec):
        k = math.ceil(mem_need / s.memory_bytes)
        if not 2 <= k <= MAX_SPLIT:
            continue
        saved = stats.gpu_hours * (1 - k)
        link = measured.get(s.name) or catalogue_link(s)
        costs = split_costs(model, k, link, tokens, training, stats)
        extra = min((c.total_s for c in costs), default=None)
        cost = (
            f"+{_ms(extra)} per step over {link.kind} ({min(costs, key=lambda c: c.total_s).parallelism}, "
            f"{link.source})"
            if extra is not None
            else "give --model or --model-dims for the time it costs per step"
        )
        gain = (
            f"a trade, not a saving: {k} x {s.name} per {spec.name} held frees {stats.gpus} big board(s) for "
            f"+{-saved:.1f} GPU-h on smaller GPUs"
        )
        out.append((k, -s.memory_bytes, Option("split", f"{k} x {s.name}", float(k), saved, f"{cost}; {gain}", extra)))
    # the fewest GPUs, and of those the largest board (the most headroom), as the three questions' answer prices
    return [min(out, key=lambda c: c[:2])[2]] if out else []
