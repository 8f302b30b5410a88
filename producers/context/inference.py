"""Infer framework, model and application class from what a piece of work looks like: a pure rules table.

Evidence is whatever a source has: a process's command line (and a few whitelisted environment variables), a
container image, a job or pod name. Two tables decide:

1. :data:`FRAMEWORKS`, tried in order (most specific first): a pattern on the evidence text names the framework,
   and for unambiguous ones (miners, LLM servers, diffusion UIs, Blender) also the application.
2. For general-purpose frameworks (PyTorch, DeepSpeed, Megatron, JAX, ...) :func:`_task` looks at the model name
   and at task words in the command line (``finetune``, ``lora``, ``pretrain``, ``run_glue.py``, ``-a resnet50``).

Every answer carries the rule that made it and a confidence (below a scheduler's declaration; callers cap it
further). ``None`` means the evidence says nothing (a desktop compositor, a browser's GPU process, ``bash``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Final


@dataclass(frozen=True, slots=True)
class Evidence:
    """What is known about a piece of work; any part may be missing."""

    argv: tuple[str, ...] = ()
    image: str | None = None
    #: job name, pod name, application labels: free text written by people
    name: str | None = None
    #: whitelisted environment variables only (see :data:`EVIDENCE_ENV`): never secrets
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None

    def text(self) -> str:
        markers = [MARKER_ENV[key] for key, _ in self.env if key in MARKER_ENV]
        parts = [*self.argv, self.image or "", self.name or "", self.cwd or "", *markers]
        return " ".join(p for p in parts if p).lower()


@dataclass(frozen=True, slots=True)
class Inference:
    application: str
    confidence: float
    framework: str | None = None
    model: str | None = None
    rule: str = ""


@dataclass(frozen=True, slots=True)
class FrameworkRule:
    framework: str
    pattern: re.Pattern[str]
    #: the application this framework alone implies; None: decided by the model and task words
    application: str | None
    confidence: float


def _rule(framework: str, pattern: str, application: str | None, confidence: float) -> FrameworkRule:
    return FrameworkRule(framework, re.compile(pattern), application, confidence)


_BIN = r"(?:^|[\s/=])"  # start of a word or of a path component
#: Tried in order; the first match names the framework.
FRAMEWORKS: Final[tuple[FrameworkRule, ...]] = (
    _rule("xmrig", _BIN + r"xmrig\b", "hashing", 0.9),
    _rule("t-rex", _BIN + r"t-rex\b", "hashing", 0.9),
    _rule("lolminer", r"lolminer", "hashing", 0.9),
    _rule("nbminer", r"nbminer", "hashing", 0.9),
    _rule("gminer", r"gminer|" + _BIN + r"miner\s+(?:-a|--algo)\b", "hashing", 0.9),
    # renamed miners still need a pool: the stratum URL gives them away
    _rule(
        "miner",
        r"stratum\d?\+(?:tcp|ssl|tls)://|ethminer|phoenixminer|nanominer|bzminer|teamredminer|ccminer|srbminer",
        "hashing",
        0.85,
    ),
    _rule("vllm", r"\bvllm\b", "llm-serving", 0.7),
    _rule("tgi", r"text-generation-(?:launcher|server|inference)", "llm-serving", 0.7),
    _rule("sglang", r"\bsglang\b", "llm-serving", 0.7),
    _rule("tensorrt-llm", r"trtllm-serve|tensorrt_?-?llm", "llm-serving", 0.6),
    _rule("llama.cpp", r"llama-server|llama\.cpp|llama-cli", "llm-serving", 0.6),
    _rule("ollama", _BIN + r"ollama\b", "llm-serving", 0.6),
    _rule("triton", r"tritonserver", None, 0.5),
    _rule("comfyui", r"comfyui", "stable-diffusion-inference", 0.7),
    _rule(
        "automatic1111",
        r"stable-diffusion-webui|" + _BIN + r"webui(?:-user)?\.(?:sh|py)\b",
        "stable-diffusion-inference",
        0.7,
    ),
    _rule("invokeai", r"invokeai", "stable-diffusion-inference", 0.7),
    _rule("diffusers", r"\bdiffusers\b", None, 0.5),
    _rule("blender", _BIN + r"blender(?:\s|$)", "rendering", 0.7),
    # NVENC/NVDEC transcoding has no class of its own in APPLICATIONS: keep the framework, say "unknown"
    _rule("ffmpeg", _BIN + r"ffmpeg(?:\s|$)", "unknown", 0.0),
    _rule("axolotl", r"axolotl", "llm-finetuning", 0.6),
    _rule("llama-factory", r"llamafactory|llama-factory|llama_factory", "llm-finetuning", 0.6),
    _rule("torchtune", r"torchtune|" + _BIN + r"tune\s+run\b", "llm-finetuning", 0.6),
    _rule("megatron", r"megatron|" + _BIN + r"pretrain_(?:gpt|llama|bert|t5|mamba|mixtral)\.py", None, 0.6),
    _rule("nemo", r"\bnemo\b|nemo_run|megatron_gpt_", None, 0.5),
    _rule("deepspeed", r"\bdeepspeed\b", None, 0.5),
    _rule("jax", r"\bjax\b|maxtext|\bpaxml\b|\bt5x\b", None, 0.5),
    _rule("tensorflow", r"tensorflow", None, 0.5),
    _rule("transformers", r"\btransformers\b|" + _BIN + r"run_[a-z_]+\.py\b|--model_name_or_path", None, 0.45),
    _rule("pytorch", r"torchrun|torch\.distributed|\btorch\b|pytorch|accelerate\s+launch|lightning", None, 0.4),
)

_LLM: Final = re.compile(
    r"llama|mistral|mixtral|qwen|gpt|falcon|gemma|\bphi-?\d|deepseek|olmo|\bopt-\d|bloom|starcoder|codellama"
    r"|\byi-\d|internlm|baichuan|chatglm|\bmpt-\d|nemotron|granite|command-r|dbrx|jamba|mamba|maxtext"
)
_BERT: Final = re.compile(r"bert|electra|\balbert|run_(?:glue|squad|ner|swag|qa)\.py")
_RESNET: Final = re.compile(r"resnet|resnext|wide_resnet")
_DIFFUSION: Final = re.compile(r"stable-diffusion|stable_diffusion|sdxl|sd-turbo|flux\.1|kandinsky|pixart")
_FINETUNE: Final = re.compile(
    r"finetun|fine[-_]tun|\bsft\b|[-_/]sft|sft[-_.]|lora|peft|\bdpo\b|[-_/]dpo|rlhf|[-_/]ppo|\borpo\b"
    r"|axolotl|llamafactory|llama-factory|torchtune|tune\s+run|\btrl\b"
)
_PRETRAIN: Final = re.compile(r"pre-?train|pre_train|from[-_]scratch|maxtext")
_SERVE: Final = re.compile(r"\bserve\b|server|inference|\binfer\b|generate|openai")
_TRAIN: Final = re.compile(r"train")

_MODEL_FLAGS: Final = frozenset(
    {
        "--model",
        "--model-id",
        "--model_id",
        "--model-path",
        "--model_path",
        "--model-name-or-path",
        "--model_name_or_path",
        "--pretrained_model_name_or_path",
        "--pretrained-model-name-or-path",
        "--base_model",
        "--base-model",
        "--hf_model",
        "--ckpt",
    }
)
#: only meaningful for image classifiers (pytorch/examples imagenet: ``main.py -a resnet50``)
_ARCH_FLAGS: Final = frozenset({"-a", "--arch"})
#: environment variables that name a model (TGI reads MODEL_ID)
MODEL_ENV: Final = ("MODEL_ID", "HF_MODEL_ID", "MODEL_NAME", "SERVED_MODEL_NAME")
#: variables whose mere presence names a launcher: torchrun's workers run `python -u script.py`, without "torch"
MARKER_ENV: Final = {"TORCHELASTIC_RUN_ID": "torchrun"}
#: the only environment variables ever read (never values that could be secrets)
EVIDENCE_ENV: Final = frozenset(MODEL_ENV) | frozenset(MARKER_ENV)
_WEIGHT_SUFFIXES: Final = (".safetensors", ".ckpt", ".gguf", ".bin", ".pt", ".pth", ".onnx", ".engine")
#: binaries whose first positional argument (or ``-m``) is the model
_MODEL_POSITIONAL: Final = {"trtllm-serve": None, "llama-server": "-m", "llama-cli": "-m"}


def normalize_model(value: str) -> str | None:
    """A model id as people write it: HF ids kept (``org/name``), local paths reduced to the weights' name."""
    value = value.strip().strip("'\"").rstrip("/")
    if value.startswith(("/", ".", "~")):
        value = PurePosixPath(value).name
    for suffix in _WEIGHT_SUFFIXES:
        value = value.removesuffix(suffix)
    return value or None


def _flag_values(argv: tuple[str, ...], flags: frozenset[str]) -> list[str]:
    out = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in flags:
            if eq:
                out.append(value)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                out.append(argv[i + 1])
    return out


def extract_model(evidence: Evidence, hashing: bool = False) -> str | None:
    """The model the command line (or a whitelisted variable) names, if any."""
    if hashing:
        return None  # miners' -a/--algo and pool arguments are not models
    argv = evidence.argv
    candidates = _flag_values(argv, _MODEL_FLAGS)
    binary = PurePosixPath(argv[0]).name if argv else ""
    if binary in _MODEL_POSITIONAL:
        flag = _MODEL_POSITIONAL[binary]
        if flag is not None:
            candidates += _flag_values(argv, frozenset({flag}))
        else:
            candidates += [a for a in argv[1:2] if not a.startswith("-")]
    if "serve" in argv:  # `vllm serve MODEL`, `text-generation-server serve MODEL`
        i = argv.index("serve")
        candidates += [a for a in argv[i + 1 : i + 2] if not a.startswith("-")]
    candidates += [value for key, value in evidence.env if key in MODEL_ENV]
    if not candidates:
        candidates = _flag_values(argv, _ARCH_FLAGS)
    for candidate in candidates:
        model = normalize_model(candidate)
        if model:
            return model
    return None


def _task(text: str, model: str | None, framework: FrameworkRule | None) -> tuple[str, float, str]:
    """Application for a general-purpose framework: from the model family and task words."""
    about = f"{text} {(model or '').lower()}"
    serving = framework is not None and framework.framework == "triton"
    if _DIFFUSION.search(about):
        if _TRAIN.search(text):
            return "unknown", 0.0, "diffusion training has no class"
        return "stable-diffusion-inference", 0.5, "diffusion model"
    if _LLM.search(about) or (framework is not None and framework.framework in ("megatron", "nemo")):
        if serving or (_SERVE.search(text) and not _TRAIN.search(text)):
            return "llm-serving", 0.5, "LLM served"
        if _FINETUNE.search(about):
            return "llm-finetuning", 0.6, "LLM with fine-tuning words"
        if _PRETRAIN.search(about):
            return "llm-pretraining", 0.6, "LLM with pre-training words"
        if framework is not None and framework.framework in ("megatron", "nemo"):
            return "llm-pretraining", 0.5, "Megatron/NeMo LLM training"
        if model is not None and _LLM.search(model.lower()):
            # training from a named checkpoint loads pretrained weights: fine-tuning is the usual case
            return "llm-finetuning", 0.45, "LLM checkpoint loaded for training"
        return "unknown", 0.0, "LLM, task unclear"
    if serving:
        return "unknown", 0.0, "served model is not an LLM"
    if _BERT.search(about):
        return "bert-training", 0.6, "BERT-family model"
    if _RESNET.search(about):
        return "resnet-training", 0.6, "ResNet-family model"
    if _FINETUNE.search(text):
        return "llm-finetuning", 0.5, "fine-tuning tool"
    return "unknown", 0.0, "no model family"


def infer(evidence: Evidence) -> Inference | None:
    """What the evidence says, or None when it names neither a framework nor a known kind of work."""
    text = evidence.text()
    if not text:
        return None
    framework = next((r for r in FRAMEWORKS if r.pattern.search(text)), None)
    hashing = framework is not None and framework.application == "hashing"
    model = extract_model(evidence, hashing)
    if framework is not None and framework.application is not None:
        return Inference(framework.application, framework.confidence, framework.framework, model, framework.framework)
    application, confidence, why = _task(text, model, framework)
    if framework is None and application == "unknown":
        return None
    name = framework.framework if framework else None
    return Inference(application, confidence, name, model, f"{name or 'no framework'}: {why}")


def infer_many(evidence: Iterable[Evidence]) -> Inference | None:
    """The best inference over several pieces of work on one GPU (a launcher and its workers, say).

    The most confident known application wins; a framework or model the winner lacks is taken from the others.
    """
    found = [i for i in map(infer, evidence) if i is not None]
    if not found:
        return None
    found.sort(key=lambda i: (i.application != "unknown", i.confidence), reverse=True)
    best = found[0]
    framework = best.framework or next((i.framework for i in found if i.framework), None)
    model = best.model or next((i.model for i in found if i.model), None)
    return Inference(best.application, best.confidence, framework, model, best.rule)


def capped(inference: Inference, cap: float) -> Inference:
    return Inference(
        inference.application,
        min(inference.confidence, cap),
        inference.framework,
        inference.model,
        inference.rule,
    )
