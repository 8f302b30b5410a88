"""Measure the links between a node's GPUs, not assume them: the figures right-sizing prices a split with.

A split's cost per hand-off is bytes / bandwidth + latency + the overhead of issuing and synchronising the copy; for
the activations a split hands on (tens of KB to a few MB) the last two dominate, and no datasheet states them. The
probe times synchronised copies from 4 KiB to 64 MiB on each path and fits ``time = latency + overhead + bytes /
bandwidth`` (:func:`fit`); the overhead alone is the time of a synchronised copy of nothing.

Paths (:class:`pipeline.topology.LinkTiming.path`):

- ``d2d``: a peer copy between two GPUs (cudaMemcpyPeerAsync; the driver stages it through the host where the pair
  has no peer access, as on GeForce boards), per ordered GPU pair;
- ``d2h2d``: device to pinned host memory to the other device, as a framework hands a tensor on by hand;
- ``host``: staged through pageable host memory (``tensor.cpu()`` then ``.to()``); without a GPU this is a
  host-to-host copy through a staging buffer (numpy), the CPU path that runs in CI.

Backends: :class:`HostCopier` (numpy, always there) and :class:`CudaCopier` (the optional ``linkprobe`` extra,
``cuda-python``). The CUDA path is small on purpose and has NOT been run on hardware (no GPU was lent while it was
written): the timing, fitting and publishing around it are the tested parts.

Emits :class:`pipeline.topology.LinkTiming` records; ``hermeneut probe links`` puts them on the node's topology
(``NodeTopology.link_timings``, the topology topic), where ``hermeneut rightsize`` reads them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import numpy as np

from pipeline.catalogue import link_kind_of
from pipeline.topology import LinkTiming, TopologyLink

#: 4 KiB to 64 MiB in steps of 4x: from one activation of a short prompt to a large gradient bucket
SIZES: Final = tuple(4096 * 4**i for i in range(8))


class Copier(Protocol):
    """One path: ``copy(n)`` copies ``n`` bytes and returns when they have arrived (synchronised)."""

    a: str
    b: str
    path: str
    kind: str

    def copy(self, nbytes: int) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Reading:
    """The copies of one size: median and spread (s) over ``repeats``."""

    nbytes: int
    median_s: float
    p10_s: float
    p90_s: float
    repeats: int


def time_copies(
    copy: Callable[[int], None],
    sizes: Sequence[int] = SIZES,
    repeats: int = 20,
    warmup: int = 3,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> list[Reading]:
    """Each size ``warmup`` times untimed (first-touch, allocation), then ``repeats`` times, each copy timed on its
    own from the host as a framework sees it (issue to arrival). Medians: one preempted copy moves no figure."""
    out = []
    for n in sizes:
        for _ in range(warmup):
            copy(n)
        took = np.empty(repeats)
        for i in range(repeats):
            t0 = clock()
            copy(n)
            took[i] = (clock() - t0) / 1e9
        p10, median, p90 = np.percentile(took, (10, 50, 90))
        out.append(Reading(n, float(median), float(p10), float(p90), repeats))
    return out


def fit(readings: Sequence[Reading]) -> tuple[float, float]:
    """(bytes per second, intercept s) of ``time = intercept + bytes / bandwidth`` over the readings' medians,
    weighted by 1 / time so the small copies (where the intercept shows) count as much as the large (where the
    bandwidth shows). A bandwidth that does not come out positive (all sizes within noise) is ``inf``."""
    if len(readings) < 2:
        raise ValueError("fit needs readings of at least two sizes")
    x = np.array([r.nbytes for r in readings], dtype=float)
    y = np.array([r.median_s for r in readings])
    slope, intercept = np.polyfit(x, y, 1, w=1 / np.maximum(y, 1e-12))
    return (float(1 / slope) if slope > 0 else float("inf")), max(0.0, float(intercept))


def measure(
    copier: Copier,
    sizes: Sequence[int] = SIZES,
    repeats: int = 20,
    source: str = "probe",
    clock: Callable[[], int] = time.perf_counter_ns,
) -> LinkTiming:
    """One path's :class:`LinkTiming`: the overhead is a synchronised copy of nothing (what issuing and waiting
    costs), the latency what the fitted intercept has beyond it."""
    overhead = time_copies(copier.copy, (0,), repeats, clock=clock)[0].median_s
    bandwidth, intercept = fit(time_copies(copier.copy, sizes, repeats, clock=clock))
    return LinkTiming(
        copier.a,
        copier.b,
        copier.path,
        copier.kind,
        bandwidth,
        max(0.0, intercept - overhead),
        overhead,
        len(sizes),
        source,
    )


@dataclass(frozen=True, slots=True)
class ProbeRun:
    """What a probe run measured and what it cost the host (CPU seconds of this process, wall seconds)."""

    timings: tuple[LinkTiming, ...]
    cpu_s: float
    wall_s: float


def probe(
    copiers: Iterable[Copier], sizes: Sequence[int] = SIZES, repeats: int = 20, source: str = "probe"
) -> ProbeRun:
    """Measure every path, closing each copier before the next is made (``copiers`` may be a generator: one
    pair's buffers at a time); the run's own CPU cost is part of the answer."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    timings = []
    for c in copiers:
        try:
            timings.append(measure(c, sizes, repeats, source))
        finally:
            c.close()
    return ProbeRun(tuple(timings), time.process_time() - cpu0, time.perf_counter() - wall0)


class HostCopier:
    """Host-staged copy with numpy: source -> staging buffer -> destination, the two copies a tensor handed on
    through pageable host memory makes. The CPU path: runs anywhere, and on a GPU node it is the host's share."""

    path = "host"
    kind = "host"

    def __init__(self, max_bytes: int = max(SIZES), a: str = "host", b: str = "host") -> None:
        self.a, self.b = a, b
        self._src = np.ones(max_bytes, dtype=np.uint8)
        self._stage = np.empty(max_bytes, dtype=np.uint8)
        self._dst = np.empty(max_bytes, dtype=np.uint8)

    def copy(self, nbytes: int) -> None:
        np.copyto(self._stage[:nbytes], self._src[:nbytes])
        np.copyto(self._dst[:nbytes], self._stage[:nbytes])

    def close(self) -> None:
        self._src = self._stage = self._dst = np.empty(0, dtype=np.uint8)


# --- the CUDA path (optional extra ``linkprobe``: cuda-python); not run on hardware ----------------------------------


def _cudart() -> Any:
    """cuda-python's runtime bindings (``cuda.bindings.runtime``, 12.6+; ``cuda.cudart`` before)."""
    try:
        from cuda.bindings import runtime  # type: ignore[import-not-found]
    except ImportError:
        try:
            from cuda import cudart as runtime  # type: ignore[import-not-found]
        except ImportError as exc:
            raise RuntimeError(
                "the GPU probe needs cuda-python: pip install 'hermeneut[linkprobe]' (or use --backend host)"
            ) from exc
    return runtime


def _code(err: Any) -> int:
    """A cudaError_t as its number (an enum member's value, or a plain int)."""
    return int(getattr(err, "value", err))


def _ok(result: Any) -> Any:
    """cuda-python returns (error, value...): raise on an error, return the value(s)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if _code(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return values[0] if len(values) == 1 else tuple(values)


class CudaCopier:
    """One GPU pair and path through the CUDA runtime: buffers of the largest size allocated once, every copy
    issued on one stream of the source device and followed by a stream synchronisation.

    ``d2d``: cudaMemcpyPeerAsync (peer access enabled where the pair has it); ``d2h2d``: through pinned host memory;
    ``host``: through pageable host memory (numpy). Written for cuda-python 12.x; untested on hardware."""

    def __init__(self, rt: Any, src: int, dst: int, path: str, a: str, b: str, kind: str, max_bytes: int) -> None:
        self.rt, self.src, self.dst, self.path, self.a, self.b = rt, src, dst, path, a, b
        _ok(rt.cudaSetDevice(dst))
        self._dst = _ok(rt.cudaMalloc(max_bytes))
        _ok(rt.cudaSetDevice(src))
        self._src = _ok(rt.cudaMalloc(max_bytes))
        self._stream = _ok(rt.cudaStreamCreate())
        peer = bool(_ok(rt.cudaDeviceCanAccessPeer(src, dst)))
        if path == "d2d" and peer:
            err = rt.cudaDeviceEnablePeerAccess(dst, 0)[0]
            if _code(err) not in (0, _code(rt.cudaError_t.cudaErrorPeerAccessAlreadyEnabled)):
                raise RuntimeError(f"CUDA error {err}")
        self.kind = kind if path == "d2d" and peer else "pcie-staged"
        self._pinned = _ok(rt.cudaMallocHost(max_bytes)) if path == "d2h2d" else None
        self._pageable = np.empty(max_bytes, dtype=np.uint8) if path == "host" else None

    def copy(self, nbytes: int) -> None:
        rt, s = self.rt, self._stream
        kind = rt.cudaMemcpyKind
        if self.path == "d2d":
            _ok(rt.cudaMemcpyPeerAsync(self._dst, self.dst, self._src, self.src, nbytes, s))
        elif self._pinned is not None:
            _ok(rt.cudaMemcpyAsync(self._pinned, self._src, nbytes, kind.cudaMemcpyDeviceToHost, s))
            _ok(rt.cudaMemcpyAsync(self._dst, self._pinned, nbytes, kind.cudaMemcpyHostToDevice, s))
        else:
            assert self._pageable is not None
            host = self._pageable.ctypes.data
            _ok(rt.cudaMemcpyAsync(host, self._src, nbytes, kind.cudaMemcpyDeviceToHost, s))
            _ok(rt.cudaStreamSynchronize(s))  # pageable: the host copy must land before it is sent on
            _ok(rt.cudaMemcpyAsync(self._dst, host, nbytes, kind.cudaMemcpyHostToDevice, s))
        _ok(rt.cudaStreamSynchronize(s))

    def close(self) -> None:
        rt = self.rt
        rt.cudaStreamDestroy(self._stream)
        rt.cudaFree(self._src)
        rt.cudaFree(self._dst)
        if self._pinned is not None:
            rt.cudaFreeHost(self._pinned)


def topology_kind(links: Sequence[TopologyLink], a: str, b: str) -> str:
    """The link kind of a GPU pair from the node's topology (nvidia-smi topo's vocabulary), ``pcie`` unknown."""
    for link in links:
        if {link.a, link.b} == {a, b}:
            return link_kind_of(link.kind)
    return "pcie"


def cuda_copiers(
    uuids: Sequence[str],
    links: Sequence[TopologyLink] = (),
    paths: Sequence[str] = ("d2d", "d2h2d", "host"),
    max_bytes: int = max(SIZES),
) -> Iterator[CudaCopier]:
    """Every ordered GPU pair on every path (``uuids`` in CUDA device order, as ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
    and the topology give them), made one at a time as :func:`probe` asks: one pair's buffers on the GPUs at once."""
    rt = _cudart()
    count = _ok(rt.cudaGetDeviceCount())
    if count < 2:
        raise RuntimeError(f"{count} CUDA device(s): a link needs two")
    ids = list(uuids) or [f"cuda:{i}" for i in range(count)]
    for i in range(count):
        for j in range(count):
            for path in paths if i != j else ():
                yield CudaCopier(rt, i, j, path, ids[i], ids[j], topology_kind(links, ids[i], ids[j]), max_bytes)
