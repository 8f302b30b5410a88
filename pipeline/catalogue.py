"""The GPU catalogue: each model's limits, so values can be made relative across generations.

A GPU that reports its own limits (NVML: power limit, memory total, max clocks, thermal thresholds, max PCIe
link) is judged against those, always: a power cap set by an operator is the limit that counts. The catalogue
fills in what a source does not report (dcgm-exporter has no power limit field by default, vGPUs report N/A)
and gives what no sample carries (architecture, NVLink bandwidth per link, MIG profiles, TDP).

Sources, per entry (``source``):
- ``nvidia-smi-xml/<file>``: real ``nvidia-smi -q -x`` captures (Telegraf's test data, MIT; see
  tests/testdata/nvidia-smi-xml/README.md); tests/unit/test_catalogue.py checks every such entry against its file.
- ``datasheet``: NVIDIA's (for the ``AMD Instinct`` rows, AMD's) published product specifications (memory, TDP,
  max clocks, PCIe, NVLink links and GB/s). Thermal thresholds for these are the values nvidia-smi typically
  reports for the board; a GPU's own NVML thresholds override them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

_MIB = 2**20
_GIB = 2**30


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A MIG GPU-instance profile: name (``1g.10gb``, ``1g.10gb+me`` with the media engines), compute slices of
    ``of`` (7 on A100/H100/H200/B200, 4 on A30), memory (its documented fraction of the board's)."""

    name: str
    slices: int
    memory_bytes: int
    of: int = 7

    @property
    def compute_share(self) -> float:
        return self.slices / self.of


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """What a GPU model can do; None where the model does not have or report it."""

    name: str
    architecture: str
    memory_bytes: int
    power_default_watts: float | None
    power_min_watts: float | None
    power_max_watts: float | None
    sm_clock_max_mhz: float | None
    memory_clock_max_mhz: float | None
    slowdown_celsius: float | None
    shutdown_celsius: float | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    nvlink_links: int = 0
    #: per link and direction
    nvlink_gbytes_per_second: float = 0.0
    mig_profiles: tuple[MigProfile, ...] = field(default=())
    data_center: bool = False
    source: str = "datasheet"

    def limit_metrics(self) -> dict[str, float]:
        """This model's limits as the schema's limit fields (only those known)."""
        values = {
            "memory_total_bytes": float(self.memory_bytes),
            "power_limit_watts": self.power_default_watts,
            "power_default_limit_watts": self.power_default_watts,
            "sm_clock_max_mhz": self.sm_clock_max_mhz,
            "graphics_clock_max_mhz": self.sm_clock_max_mhz,
            "memory_clock_max_mhz": self.memory_clock_max_mhz,
            "temperature_slowdown_celsius": self.slowdown_celsius,
            "temperature_shutdown_celsius": self.shutdown_celsius,
            "pcie_link_gen_max": None if self.pcie_gen_max is None else float(self.pcie_gen_max),
            "pcie_link_width_max": None if self.pcie_width_max is None else float(self.pcie_width_max),
            "nvlink_links_max": float(self.nvlink_links) if self.nvlink_links else None,
        }
        return {k: v for k, v in values.items() if v is not None}


def _mig(
    memory_bytes: int,
    profiles: tuple[tuple[str, int, int], ...],
    of: int = 7,
    parts: int = 8,
    measured_mib: dict[int, int] | None = None,
) -> tuple[MigProfile, ...]:
    """A board's MIG profiles from NVIDIA's table: (name, compute slices of ``of``, memory in ``parts`` of the
    board's). ``measured_mib``: the memory a real board reports for an instance of so many ``parts`` (every profile
    with the same memory share has the same memory: 1g.20gb and 2g.20gb, 3g.40gb and 4g.40gb on a real H100), used
    instead of the nominal fraction, which is up to 11 % more than a real instance holds."""
    measured = measured_mib or {}
    return tuple(
        MigProfile(name, slices, measured[share] * _MIB if share in measured else memory_bytes * share // parts, of)
        for name, slices, share in profiles
    )


def _seven(gb: tuple[int, int, int, int, int]) -> tuple[tuple[str, int, int], ...]:
    """The seven profiles of the 7-slice boards, named by the board's memory: 1g (1/8 of memory, with and without
    media engines), 1g with 2/8, 2g, 3g and 4g with 4/8 of it, 7g with all (``gb``: the sizes in the names)."""
    eighth, quarter, _, half, whole = gb
    return (
        (f"1g.{eighth}gb", 1, 1),
        (f"1g.{eighth}gb+me", 1, 1),
        (f"1g.{quarter}gb", 1, 2),
        (f"2g.{quarter}gb", 2, 2),
        (f"3g.{half}gb", 3, 4),
        (f"4g.{half}gb", 4, 4),
        (f"7g.{whole}gb", 7, 8),
    )


# NVIDIA's Multi-Instance GPU User Guide, "Supported MIG Profiles"
# (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): every GPU-instance profile of each
# board, with its fraction of the SMs and of the memory
_A100_40_MIG = _mig(40 * _GIB, _seven((5, 10, 20, 20, 40)))
_A100_80_MIG = _mig(80 * _GIB, _seven((10, 20, 40, 40, 80)))
# memory as real boards report it: the lent H100's `nvidia-smi mig -lgip` (tests/testdata/nvml-h100-lent: 9.75,
# 19.62, 39.50, 79.25 GiB) and the MIG instances of a real H100 and H200 (tests/testdata/nvidia-smi-q-mig); the
# H200's whole-GPU instance was not seen and keeps the nominal fraction
_H100_MIG = _mig(80 * _GIB, _seven((10, 20, 40, 40, 80)), measured_mib={1: 9984, 2: 20096, 4: 40448, 8: 81152})
_H200_MIG = _mig(141 * _GIB, _seven((18, 35, 71, 71, 141)), measured_mib={1: 16384, 2: 33280, 4: 71424})
_B200_MIG = _mig(180 * _GIB, _seven((23, 45, 90, 90, 180)))
_A30_MIG = _mig(
    24 * _GIB, (("1g.6gb", 1, 1), ("1g.6gb+me", 1, 1), ("2g.12gb", 2, 2), ("2g.12gb+me", 2, 2), ("4g.24gb", 4, 4)),
    of=4, parts=4,
)  # fmt: skip

SPECS: Final[tuple[GpuSpec, ...]] = (
    # --- data-centre GPUs (datasheets) ---
    # the H100's thermal thresholds as NVML reported them on a real one (tests/testdata/nvml-h100-lent, driver
    # 580.159.04: slowdown 89 C, shutdown 95 C; its T.Limit, 87 C, is the same on another H100 in nvidia-smi-csv)
    GpuSpec("NVIDIA H100 80GB HBM3", "Hopper", 80 * _GIB, 700, 200, 700, 1980, 2619, 89, 95, 5, 16, 18, 25.0,
            _H100_MIG, True),
    GpuSpec("NVIDIA H200", "Hopper", 141 * _GIB, 700, 200, 700, 1980, 3201, 90, 92, 5, 16, 18, 25.0, _H200_MIG, True),
    GpuSpec("NVIDIA B200", "Blackwell", 180 * _GIB, 1000, None, 1000, None, None, None, None, 5, 16, 18, 50.0,
            _B200_MIG, True),
    GpuSpec("NVIDIA A30", "Ampere", 24 * _GIB, 165, None, 165, 1440, 1215, None, None, 4, 16, 4, 25.0, _A30_MIG,
            True),
    GpuSpec("NVIDIA A100-SXM4-80GB", "Ampere", 80 * _GIB, 400, 100, 400, 1410, 1593, 89, 92, 4, 16, 12, 25.0,
            _A100_80_MIG, True),
    GpuSpec("NVIDIA A100-SXM4-40GB", "Ampere", 40 * _GIB, 400, 100, 400, 1410, 1215, 89, 92, 4, 16, 12, 25.0,
            _A100_40_MIG, True),
    GpuSpec("NVIDIA L40S", "Ada Lovelace", 48 * _GIB, 350, 100, 350, 2520, 9001, 88, 93, 4, 16, data_center=True),
    GpuSpec("Tesla V100-SXM2-32GB", "Volta", 32 * _GIB, 300, 150, 300, 1530, 877, 87, 90, 3, 16, 6, 25.0,
            data_center=True),
    GpuSpec("NVIDIA GeForce GTX 1080 Ti", "Pascal", 11 * _GIB, 250, 125, 300, 1911, 5505, 91, 96, 3, 16),
    # --- AMD Instinct (AMD's product pages and data sheets, amd.com/en/products/accelerators/instinct): memory,
    # TDP, peak engine clock, PCIe, Infinity Fabric links (as nvlink_*: the GPU-to-GPU links) and each link's
    # bandwidth per direction (half the bidirectional peak AMD quotes). An MI250X is two dies (GCDs) that the
    # driver shows as two GPUs: its memory is one die's (64 of the module's 128 GB), its power (500 W TDP, 560 W
    # peak) and links (8 x 100 GB/s) are the module's. Thermal thresholds: not published; none guessed.
    GpuSpec("AMD Instinct MI250X", "CDNA2", 64 * _GIB, 500, None, 560, 1700, 1600, None, None, 4, 16, 8, 50.0,
            data_center=True),
    GpuSpec("AMD Instinct MI300X", "CDNA3", 192 * _GIB, 750, None, 750, 2100, None, None, None, 5, 16, 7, 64.0,
            data_center=True),
    GpuSpec("AMD Instinct MI325X", "CDNA3", 256 * _GIB, 1000, None, 1000, 2100, None, None, None, 5, 16, 7, 64.0,
            data_center=True),
    GpuSpec("AMD Instinct MI350X", "CDNA4", 288 * _GIB, 1000, None, 1000, 2200, None, None, None, 5, 16, 7, 76.8,
            data_center=True),
    # --- real nvidia-smi captures (tests/testdata/nvidia-smi-xml) ---
    GpuSpec("NVIDIA A10G", "Ampere", 23028 * _MIB, 300, 100, 300, 1710, 6251, 95, 98, 4, 16, data_center=True,
            source="nvidia-smi-xml/a10g.xml"),
    GpuSpec("NVIDIA GeForce RTX 3090", "Ampere", 24576 * _MIB, 350, 100, 480, 2100, 9751, 95, 98, 4, 16,
            source="nvidia-smi-xml/3090-v13.xml"),
    GpuSpec("NVIDIA GeForce RTX 3080", "Ampere", 10240 * _MIB, 320, 100, 336, 2100, 9501, 95, 98, 4, 16,
            source="nvidia-smi-xml/rtx-3080-v13.xml"),
    GpuSpec("NVIDIA GeForce RTX 3060", "Ampere", 12288 * _MIB, 170, 100, 190, 2145, 7501, 95, 98, 4, 16,
            source="nvidia-smi-xml/rtx-3060-v12.xml"),
    GpuSpec("NVIDIA GeForce RTX 2080", "Turing", 8192 * _MIB, 215, 105, 240, 2160, 7000, 97, 100, 3, 16,
            source="nvidia-smi-xml/dual_2080-v13.xml"),
    GpuSpec("NVIDIA GeForce RTX 2070", "Turing", 8192 * _MIB, 175, 125, 200, 2100, 7001, 91, 94, 3, 16,
            source="nvidia-smi-xml/dual_2070-v13.xml"),
    GpuSpec("NVIDIA RTX 4000 SFF Ada Generation", "Ada Lovelace", 20475 * _MIB, 70, 30, 70, 3105, 7001, None, None,
            4, 16, source="nvidia-smi-xml/rtx-4000-sff-ada-v13.xml"),
    GpuSpec("NVIDIA GeForce GTX 1660 Ti", "Turing", 5912 * _MIB, 130, 70, 130, 2145, 4001, 93, 96, 3, 16,
            source="nvidia-smi-xml/gtx-1660-ti.xml"),
    GpuSpec("NVIDIA GeForce GT 1030", "Pascal", 1998 * _MIB, 30, 25.5, 30, 1949, 3004, 99, 102, 3, 4,
            source="nvidia-smi-xml/gt-1030.xml"),
    GpuSpec("Quadro P2000", "Pascal", 5120 * _MIB, 75, 75, 75, 1721, 3504, 101, 104, 3, 16,
            source="nvidia-smi-xml/quadro-p2000-v12.xml"),
    GpuSpec("Quadro P400", "Pascal", 1998 * _MIB, None, None, None, 1252, 2005, 100, 103, 3, 16,
            source="nvidia-smi-xml/quadro-p400.xml"),
)  # fmt: skip

#: Names NVML has used for the same board (driver versions, "Tesla"/"NVIDIA" prefixes, unknown-name drivers)
_ALIASES: Final[dict[str, str]] = {
    "graphics device": "NVIDIA GeForce GTX 1660 Ti",  # driver 418.43 did not know the name yet
    "geforce gtx 1080 ti": "NVIDIA GeForce GTX 1080 Ti",
    "nvidia h100 sxm5 80gb": "NVIDIA H100 80GB HBM3",
    "nvidia h200 141gb hbm3e": "NVIDIA H200",
    "tesla v100-sxm2-32gb": "Tesla V100-SXM2-32GB",
}


def _key(name: str) -> str:
    name = re.sub(r"\s+", " ", name.strip().lower())
    return re.sub(r"^(nvidia |tesla )", "", name)


_BY_KEY: Final[dict[str, GpuSpec]] = {_key(s.name): s for s in SPECS}


def lookup(product_name: str) -> GpuSpec | None:
    """The spec of a model by the product name NVML reports, tolerant of prefixes, case and spacing.

    A MIG instance's model (``NVIDIA A100-SXM4-40GB MIG 1g.5gb``) resolves to its parent board.
    """
    name = re.sub(r"\s+MIG\s+\S+$", "", product_name.strip())
    key = _key(_ALIASES.get(name.lower(), name))
    return _BY_KEY.get(key)


_MIG_MODEL: Final = re.compile(r"\sMIG\s+(?:(\d+)c\.)?(\S+)$")


def mig_profile(model: str) -> tuple[MigProfile, int | None] | None:
    """The GPU-instance profile of a MIG device's model (``NVIDIA H100 80GB HBM3 MIG 3g.40gb``) and, for a compute
    instance that shares its GPU instance with others (``NVIDIA H200 MIG 1c.3g.71gb``: 1 of the 3g instance's 3
    compute slices, as a real H200 lists it), its compute slices; None where the board or profile is unknown."""
    found = _MIG_MODEL.search(model)
    spec = lookup(model)
    if found is None or spec is None:
        return None
    profile = next((p for p in spec.mig_profiles if p.name == found[2]), None)
    if profile is None:
        return None
    return profile, (None if found[1] is None else int(found[1]))


# --- models: what a split hands on --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelDims:
    """The dimensions of a model that set what a split moves: ``hidden`` (the width of the activation handed on per
    token; for a convolutional model, the elements per sample at its widest stage boundary, ``per_token`` False),
    ``layers`` (transformer blocks: the tensor-parallel all-reduces), ``params`` (the gradients a data-parallel step
    all-reduces), ``dtype_bytes`` (as the model is usually run), and where each number is from."""

    name: str
    hidden: int
    layers: int
    params: int
    dtype_bytes: int
    source: str
    per_token: bool = True

    def activation_bytes(self, tokens: int, batch: int = 1, dtype_bytes: int | None = None) -> int:
        """Bytes of one activation handed across a cut: tokens x hidden x dtype per sequence (a convolutional
        model's widest feature map per sample, whatever ``tokens``)."""
        width = (tokens if self.per_token else 1) * self.hidden
        return batch * width * (dtype_bytes or self.dtype_bytes)

    def gradient_bytes(self, dtype_bytes: int | None = None) -> int:
        return self.params * (dtype_bytes or self.dtype_bytes)


_HF = "huggingface.co/{}/blob/main/config.json"

MODELS: Final[tuple[ModelDims, ...]] = (
    # GPT-2 (Radford et al. 2019, Table 2: 117M/345M/762M/1542M as counted then); n_embd and n_layer from the
    # published configs, parameters as the released checkpoints count them (tied embeddings once)
    ModelDims("gpt2", 768, 12, 124_439_808, 4, _HF.format("openai-community/gpt2") + " (n_embd, n_layer)"),
    ModelDims("gpt2-medium", 1024, 24, 354_823_168, 4, _HF.format("openai-community/gpt2-medium")),
    ModelDims("gpt2-large", 1280, 36, 774_030_080, 4, _HF.format("openai-community/gpt2-large")),
    ModelDims("gpt2-xl", 1600, 48, 1_557_611_200, 4, _HF.format("openai-community/gpt2-xl")),
    # Llama 3 (Meta, 2024): hidden_size, num_hidden_layers; 8.03B / 70.6B parameters (model cards), bf16
    ModelDims("llama3-8b", 4096, 32, 8_030_000_000, 2,
              _HF.format("meta-llama/Meta-Llama-3-8B") + "; model card (8.03B)"),
    ModelDims("llama3-70b", 8192, 80, 70_600_000_000, 2,
              _HF.format("meta-llama/Meta-Llama-3-70B") + "; model card (70.6B)"),
    # BERT (Devlin et al. 2018, arXiv:1810.04805 sec. 3: L=12 H=768 110M, L=24 H=1024 340M)
    ModelDims("bert-base", 768, 12, 110_000_000, 4, "arXiv:1810.04805 sec. 3 (BERT-base: L=12, H=768, 110M)"),
    ModelDims("bert-large", 1024, 24, 340_000_000, 4, "arXiv:1810.04805 sec. 3 (BERT-large: L=24, H=1024, 340M)"),
    # ResNet-50 (He et al. 2015, arXiv:1512.03385 Table 1): the conv2_x output, 56 x 56 x 256 at 224 px, is its
    # widest stage boundary; 16 bottleneck blocks; 25,557,032 parameters (torchvision's resnet50 weights)
    ModelDims("resnet50", 56 * 56 * 256, 16, 25_557_032, 4,
              "arXiv:1512.03385 Table 1 (conv2_x 56x56x256); torchvision resnet50 (25,557,032 params)", False),
    # SDXL's UNet (Podell et al. 2023, arXiv:2307.01952: 2.6B parameters): at 1024 px its latent is 128 x 128 and
    # its first block 320 channels wide (unet/config.json block_out_channels [320, 640, 1280]); transformer blocks
    # per level [1, 2, 10] over 2 down, 3 up and the mid block make 70; fp16
    ModelDims("sdxl-unet", 128 * 128 * 320, 70, 2_600_000_000, 2,
              "arXiv:2307.01952; huggingface.co/stabilityai/stable-diffusion-xl-base-1.0/blob/main/unet/config.json",
              False),
)  # fmt: skip

_MODELS_BY_NAME: Final[dict[str, ModelDims]] = {m.name: m for m in MODELS}


def model_dims(name: str) -> ModelDims | None:
    """A catalogue model by name (``gpt2``, ``llama3-8b``; case and ``_`` for ``-`` tolerated)."""
    return _MODELS_BY_NAME.get(name.strip().lower().replace("_", "-"))


# --- links: published figures, until the probe has measured the fleet's own ---------------------------------------


@dataclass(frozen=True, slots=True)
class LinkFigures:
    """One kind of GPU-to-GPU path: usable bandwidth per direction, one-way latency of a small copy, and the
    per-hand-off overhead of issuing it (the runtime call a framework makes per copy), each with its source."""

    kind: str
    bytes_per_second: float
    latency_s: float
    overhead_s: float
    source: str


#: cudaMemcpyAsync's per-call overhead, 5-7 us (Wu et al., "DualPath", arXiv:2602.21548 sec. 5.2, measured on
#: small chunks): the middle of the range, charged once per hand-off
COPY_CALL_OVERHEAD_S: Final = 6e-6

#: Published measurements per path kind (bandwidth and latency from CUDA's p2pBandwidthLatencyTest as posted):
#: - ``pcie-staged``: GPUs without peer access (GeForce), copies staged through host memory by the driver:
#:   9.48-9.73 GB/s between GTX 1080 Ti over PCIe 3.0 (github.com/NVIDIA/nccl/issues/257, "Unidirectional
#:   P2P=Disabled"); 11.1-19.6 us, median 16.5 us, P2P=Disabled GPU latency (github.com/NVIDIA/cuda-samples/issues/230)
#: - ``pcie``: peer-to-peer over a PCIe switch or host bridge: bandwidth from the catalogue's link (PCIe per-lane
#:   rate x width), the same latency as above until a probe measures it (no posted P2P-over-PCIe latency found)
#: - ``nvlink``: bandwidth from the catalogue (links x GB/s per link); 1.8-2.3 us, median 1.9 us, P2P=Enabled
#:   GPU latency over NVLink (github.com/NVIDIA/cuda-samples/issues/230)
#: - ``sys``: across CPU sockets: the staged figures (the worst posted), marked as such
PUBLISHED_LINKS: Final[dict[str, LinkFigures]] = {
    "pcie-staged": LinkFigures(
        "pcie-staged", 9.5e9, 16.5e-6, COPY_CALL_OVERHEAD_S,
        "published: GTX 1080 Ti P2P=Disabled 9.5 GB/s (NVIDIA/nccl#257), latency 16.5 us (NVIDIA/cuda-samples#230), "
        "copy call 6 us (arXiv:2602.21548)",
    ),
    "nvlink": LinkFigures(
        "nvlink", 25e9, 1.9e-6, COPY_CALL_OVERHEAD_S,
        "published: NVLink P2P latency 1.9 us (NVIDIA/cuda-samples#230), copy call 6 us (arXiv:2602.21548)",
    ),
    "pcie": LinkFigures(
        "pcie", 15.75e9, 16.5e-6, COPY_CALL_OVERHEAD_S,
        "published: PCIe 3.0 x16 rate, latency 16.5 us (NVIDIA/cuda-samples#230), copy call 6 us (arXiv:2602.21548)",
    ),
    "sys": LinkFigures(
        "sys", 9.5e9, 16.5e-6, COPY_CALL_OVERHEAD_S,
        "published: the staged figures (NVIDIA/nccl#257, NVIDIA/cuda-samples#230), copy call 6 us (arXiv:2602.21548)",
    ),
}  # fmt: skip

#: nvidia-smi topo's path kinds (pipeline.topology.TopologyLink.kind) as the link kinds above
TOPO_LINK_KIND: Final[dict[str, str]] = {"PIX": "pcie", "PXB": "pcie", "PHB": "pcie", "NODE": "pcie", "SYS": "sys"}


def link_kind_of(topo_kind: str) -> str:
    """``NV<n>`` -> nvlink, PIX/PXB/PHB/NODE -> pcie, SYS -> sys (anything else: pcie-staged, the slowest posted)."""
    return "nvlink" if topo_kind.startswith("NV") else TOPO_LINK_KIND.get(topo_kind, "pcie-staged")
