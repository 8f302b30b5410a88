"""The inference rules on realistic command lines (as the projects document their launch commands), and on the
real process lists of the nvidia-smi captures, which are desktops and must infer nothing."""

from __future__ import annotations

import shlex

import pytest

from producers.context.inference import Evidence, Inference, capped, infer, infer_many, normalize_model
from producers.context.processes import parse_nvidia_smi_processes
from tests import TESTDATA

XML = TESTDATA / "nvidia-smi-xml"

# (command line, application, framework, model); each is the launch command its project documents
CASES = [
    # vLLM docs, "OpenAI-compatible server": `vllm serve <model>` and the older api_server module
    (
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 4",
        "llm-serving",
        "vllm",
        "meta-llama/Llama-3.1-8B-Instruct",
    ),
    (
        "/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model mistralai/Mistral-7B-Instruct-v0.3 --port 8000",
        "llm-serving",
        "vllm",
        "mistralai/Mistral-7B-Instruct-v0.3",
    ),
    # TGI docs: the launcher, and the shard processes it starts (which hold the GPUs)
    (
        "text-generation-launcher --model-id meta-llama/Meta-Llama-3-8B-Instruct --num-shard 2",
        "llm-serving",
        "tgi",
        "meta-llama/Meta-Llama-3-8B-Instruct",
    ),
    (
        "/opt/conda/bin/python3.11 /opt/conda/bin/text-generation-server serve meta-llama/Meta-Llama-3-8B-Instruct "
        "--sharded --uds-path /tmp/text-generation-server",
        "llm-serving",
        "tgi",
        "meta-llama/Meta-Llama-3-8B-Instruct",
    ),
    # SGLang docs
    (
        "python3 -m sglang.launch_server --model-path Qwen/Qwen2.5-72B-Instruct --tp 4 --port 30000",
        "llm-serving",
        "sglang",
        "Qwen/Qwen2.5-72B-Instruct",
    ),
    # TensorRT-LLM docs
    (
        "trtllm-serve TinyLlama/TinyLlama-1.1B-Chat-v1.0 --port 8000",
        "llm-serving",
        "tensorrt-llm",
        "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
    ),
    # llama.cpp README: a local GGUF file becomes its weights' name
    (
        "llama-server -m /models/Meta-Llama-3-8B-Instruct-Q4_K_M.gguf --port 8080 -ngl 99",
        "llm-serving",
        "llama.cpp",
        "Meta-Llama-3-8B-Instruct-Q4_K_M",
    ),
    # Megatron-LM examples/gpt3: torchrun's workers run `python -u pretrain_gpt.py ...`
    (
        "/usr/bin/python -u /workspace/megatron/pretrain_gpt.py --tensor-model-parallel-size 8 "
        "--pipeline-model-parallel-size 16 --num-layers 96 --hidden-size 12288",
        "llm-pretraining",
        "megatron",
        None,
    ),
    # MaxText README
    (
        "python3 -u MaxText/train.py MaxText/configs/base.yml run_name=run0 base_output_directory=gs://bucket/out",
        "llm-pretraining",
        "jax",
        None,
    ),
    # Hugging Face transformers examples: run_glue (BERT), run_clm from a pretrained checkpoint
    (
        "python run_glue.py --model_name_or_path google-bert/bert-base-cased --task_name mrpc --do_train --do_eval",
        "bert-training",
        "transformers",
        "google-bert/bert-base-cased",
    ),
    (
        "/usr/bin/python3 -u run_clm.py --model_name_or_path meta-llama/Llama-3.2-1B --dataset_name wikitext "
        "--do_train --output_dir /tmp/clm",
        "llm-finetuning",
        "transformers",
        "meta-llama/Llama-3.2-1B",
    ),
    # pytorch/examples imagenet and torchvision's classification references
    (
        "python main.py -a resnet50 --dist-url tcp://127.0.0.1:23456 --dist-backend nccl --multiprocessing-distributed "
        "--world-size 1 --rank 0 /data/imagenet",
        "resnet-training",
        None,
        "resnet50",
    ),
    (
        "torchrun --nproc_per_node=8 train.py --model resnet50 --batch-size 128 --lr 0.5",
        "resnet-training",
        "pytorch",
        "resnet50",
    ),
    # fine-tuning tools: axolotl, torchtune, an alpaca-lora style script
    ("accelerate launch -m axolotl.cli.train examples/llama-3/lora-8b.yml", "llm-finetuning", "axolotl", None),
    (
        "tune run lora_finetune_single_device --config llama3_1/8B_lora_single_device",
        "llm-finetuning",
        "torchtune",
        None,
    ),
    (
        "python3 -u finetune.py --base_model meta-llama/Llama-2-7b-hf --lora_r 8",
        "llm-finetuning",
        None,
        "meta-llama/Llama-2-7b-hf",
    ),
    # DeepSpeed launcher with a script that says nothing about its model: framework known, class not
    ("deepspeed --num_gpus=8 train.py --deepspeed ds_config.json", "unknown", "deepspeed", None),
    # miners (their READMEs): binaries by name, and a renamed one given away by its stratum pool
    (
        "./xmrig -o pool.supportxmr.com:443 -u 44AFFq5kSiGBoZ4NMDwYtN18obc8AemS33DBLWs3H7otXft3XjrpDtQGv7Sq -k --tls "
        "--cuda",
        "hashing",
        "xmrig",
        None,
    ),
    ("./t-rex -a kawpow -o stratum+tcp://rvn.2miners.com:6060 -u RXXX.rig0 -p x", "hashing", "t-rex", None),
    ("./lolMiner --algo ETCHASH --pool etc.2miners.com:1010 --user 0x1f2e.rig", "hashing", "lolminer", None),
    ("/opt/nbminer/nbminer -a ergo -o stratum+tcp://ergo.herominers.com:10250 -u 9fXX.rig", "hashing", "nbminer", None),
    ("./miner --algo kawpow --server rvn.2miners.com:6060 --user RXXX.rig", "hashing", "gminer", None),
    ("/tmp/.cache/systemd-helper -o stratum+ssl://pool.example.net:443 -u wallet.w1", "hashing", "miner", None),
    # Blender manual, command-line rendering with Cycles on OptiX
    (
        "blender -b /scenes/classroom.blend -o //render_ -F PNG -E CYCLES -a -- --cycles-device OPTIX",
        "rendering",
        "blender",
        None,
    ),
    # NVIDIA's FFmpeg transcoding guide: NVENC has no application class, the framework is kept
    (
        "ffmpeg -y -vsync 0 -hwaccel cuda -hwaccel_output_format cuda -i input.mp4 -c:a copy -c:v h264_nvenc -b:v 5M "
        "output.mp4",
        "unknown",
        "ffmpeg",
        None,
    ),
    # ComfyUI README; diffusers with an SDXL checkpoint
    ("python /opt/ComfyUI/main.py --listen 0.0.0.0 --port 8188", "stable-diffusion-inference", "comfyui", None),
    (
        "python generate.py --model stabilityai/stable-diffusion-xl-base-1.0",
        "stable-diffusion-inference",
        None,
        "stabilityai/stable-diffusion-xl-base-1.0",
    ),
    # Triton serving a model repository: could be anything
    ("tritonserver --model-repository=/models", "unknown", "triton", None),
]


@pytest.mark.parametrize(("cmdline", "application", "framework", "model"), CASES)
def test_realistic_command_lines(cmdline: str, application: str, framework: str | None, model: str | None) -> None:
    found = infer(Evidence(argv=tuple(shlex.split(cmdline))))
    assert found is not None
    assert (found.application, found.framework, found.model) == (application, framework, model), found.rule
    assert 0.0 <= found.confidence <= 0.9
    assert (found.confidence == 0.0) == (application == "unknown")


@pytest.mark.parametrize("cmdline", ["bash", "python", "python train.py", "sleep 100", "/usr/bin/nvidia-smi -l 1"])
def test_commands_that_say_nothing(cmdline: str) -> None:
    assert infer(Evidence(argv=tuple(shlex.split(cmdline)))) is None


def test_real_desktop_processes_infer_nothing() -> None:
    """Every process in the real desktop nvidia-smi captures (Xorg, compositors, browsers' GPU processes, editors;
    not the lent H100's, whose one process is a PyTorch job: below)."""
    names = [
        p.name
        for path in sorted(XML.glob("*.xml"))
        if "-lent-" not in path.name
        for procs in parse_nvidia_smi_processes(path.read_text()).values()
        for p in procs
    ]
    assert len(names) >= 20  # the captures hold 33 process entries, some with empty names
    assert any("chromium --type=gpu-process" in n for n in names)
    assert [n for n in names if infer(Evidence(argv=tuple(n.split()))) is not None] == []


def test_working_directory_and_torchrun_marker_are_evidence() -> None:
    webui = infer(Evidence(argv=("python", "launch.py", "--xformers"), cwd="/home/u/stable-diffusion-webui"))
    assert webui is not None and (webui.application, webui.framework) == ("stable-diffusion-inference", "automatic1111")
    assert infer(Evidence(argv=("python", "launch.py", "--xformers"))) is None
    worker = Evidence(
        argv=("/usr/bin/python3", "-u", "train.py", "--arch", "resnet101"), env=(("TORCHELASTIC_RUN_ID", "x"),)
    )
    found = infer(worker)
    assert found is not None and (found.application, found.framework) == ("resnet-training", "pytorch")


def test_model_from_whitelisted_environment_and_image() -> None:
    tgi = Evidence(
        image="ghcr.io/huggingface/text-generation-inference:2.4.0", env=(("MODEL_ID", "google/gemma-2-9b-it"),)
    )
    found = infer(tgi)
    assert found == Inference("llm-serving", 0.7, "tgi", "google/gemma-2-9b-it", "tgi")


def test_name_hints() -> None:
    found = infer(Evidence(name="serve-qwen2.5-72b-vllm"))
    assert found is not None and (found.application, found.framework) == ("llm-serving", "vllm")
    sft = infer(Evidence(name="llama3-8b-sft-run7"))
    assert sft is not None and sft.application == "llm-finetuning"


def test_several_processes_on_one_gpu() -> None:
    launcher = Evidence(argv=("torchrun", "--nproc_per_node=8", "train.py"))
    worker = Evidence(
        argv=("python", "-u", "train.py", "--model_name_or_path", "meta-llama/Llama-3.1-8B", "--use_lora")
    )
    found = infer_many([launcher, worker])
    assert found is not None
    assert (found.application, found.framework, found.model) == (
        "llm-finetuning",
        "transformers",
        "meta-llama/Llama-3.1-8B",
    )
    assert infer_many([Evidence(argv=("bash",))]) is None


@pytest.mark.parametrize(
    ("raw", "model"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"),
        ("/mnt/models/llama-3-70b/", "llama-3-70b"),
        ("./ckpt/v1-5-pruned-emaonly.safetensors", "v1-5-pruned-emaonly"),
        ("'resnet50'", "resnet50"),
        ("", None),
    ],
)
def test_normalize_model(raw: str, model: str | None) -> None:
    assert normalize_model(raw) == model


def test_capped() -> None:
    found = Inference("hashing", 0.9, "xmrig")
    assert capped(found, 0.6).confidence == 0.6
    assert capped(found, 0.95) == found


def test_a_bare_python_in_a_torch_environment_names_the_framework_not_an_application() -> None:
    """The lent H100's load capture: a bf16 matmul loop run as ``/opt/torch/.venv/bin/python3``."""
    procs = parse_nvidia_smi_processes((XML / "h100-80gb-hbm3-lent-load.xml").read_text())
    [proc] = [p for found in procs.values() for p in found]
    found = infer(Evidence(argv=(proc.name,)))
    assert found is not None and (found.application, found.framework, found.confidence) == ("unknown", "pytorch", 0.0)
