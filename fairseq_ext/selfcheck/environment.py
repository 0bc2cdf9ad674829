"""The ``env`` stage: what the check runs on. The device (name, memory, compute capability,
bf16 support), the NVIDIA driver (``nvidia-smi``), torch with its CUDA and cuDNN, fairseq and
the packages the plugin uses, the CPU and Python, and one matmul per precision on the device
(so that a broken install fails here, in seconds, and not ten minutes into training)."""
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from typing import List

import torch

from fairseq_ext.selfcheck.stage_files import table, write_stage

PACKAGES = ("fairseq", "fairseq-fixed", "fairseq_ext", "torch", "numpy", "hydra-core", "omegaconf", "sacrebleu",
            "sentencepiece", "subword-nmt", "sacremoses", "compare-mt", "bitarray", "matplotlib", "pytest",
            "tensorboardX", "nltk", "PyYAML")


def package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    try:
        import fairseq

        versions["fairseq (import)"] = fairseq.__version__
    except ImportError as e:  # the check says so instead of failing
        versions["fairseq (import)"] = f"not importable: {e}"
    return {k: v for k, v in versions.items() if v is not None or k in ("fairseq (import)", "torch")}


def nvidia_smi() -> dict:
    if not shutil.which("nvidia-smi"):
        return {}
    query = "name,driver_version,memory.total,compute_cap"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = [dict(zip(query.split(","), (c.strip() for c in line.split(",")))) for line in out.stdout.splitlines()
            if line.strip()]
    return {"gpus": rows} if rows else {}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_facts(device: torch.device) -> dict:
    facts = {"device": str(device), "torch": torch.__version__, "cuda_build": torch.version.cuda,
             "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
             "cuda_available": torch.cuda.is_available(), "cpu_threads": torch.get_num_threads(),
             "cpu_count": os.cpu_count(), "cpu": cpu_name(),
             "python": sys.version.split()[0], "platform": platform.platform()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(gpu_name=props.name, gpu_memory_gib=round(props.total_memory / 2 ** 30, 1),
                     compute_capability=f"{props.major}.{props.minor}", gpu_count=torch.cuda.device_count(),
                     bf16_supported=torch.cuda.is_bf16_supported())
    return facts


def precision_smoke(device: torch.device) -> dict:
    """One 256 x 256 matmul per precision on the device, against fp64: the relative error."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 256, generator=g, dtype=torch.float64), torch.randn(256, 256, generator=g,
                                                                              dtype=torch.float64)
    exact = a @ b
    out = {}
    for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        try:
            got = (a.to(device, dtype) @ b.to(device, dtype)).double().cpu()
            out[name] = float((got - exact).abs().max() / exact.abs().max())
        except RuntimeError as e:  # e.g. fp16 matmul on an old CPU build
            out[name] = f"failed: {str(e).splitlines()[0]}"
    return out


def run(out: str, device: torch.device, **_) -> List[str]:
    facts, versions, smi = device_facts(device), package_versions(), nvidia_smi()
    smoke = precision_smoke(device)
    ok = all(isinstance(v, float) for v in smoke.values())
    lines = ["# Environment", ""]
    rows = [["device", facts.get("gpu_name", facts["cpu"]) + f" ({device})"]]
    if device.type == "cuda":
        rows += [["GPU memory", f"{facts['gpu_memory_gib']} GiB"], ["compute capability", facts["compute_capability"]],
                 ["GPUs", facts["gpu_count"]], ["bf16", "yes" if facts["bf16_supported"] else "no"]]
    for gpu in smi.get("gpus", [])[:1]:
        rows.append(["NVIDIA driver", gpu.get("driver_version")])
    rows += [["torch", facts["torch"]], ["CUDA (torch build)", facts["cuda_build"]], ["cuDNN", facts["cudnn"]],
             ["Python", facts["python"]], ["CPU cores", facts["cpu_count"]], ["platform", facts["platform"]]]
    rows += [[name, version] for name, version in versions.items() if name != "torch"]
    lines += table(["what", "version / value"], rows, align_right_from=2)
    lines += ["", "One 256 x 256 matmul on the device, relative error against fp64:", ""]
    lines += table(["precision", "relative error"], [[k, f"{v:.1e}" if isinstance(v, float) else v]
                                                     for k, v in smoke.items()])
    write_stage(out, "env", {"result": "ok" if ok else "a precision failed", **facts, "packages": versions,
                             "nvidia_smi": smi, "matmul_relative_error": smoke}, lines)
    return lines
