"""What the doctor reports of a machine: versions (Python, torch and its CUDA, DALI and its wheel), the driver, the
GPU and whether it has hardware JPEG decoders (nvidia-smi; NVML through nvidia-ml-py where installed). doctor.py
runs the checks; the throughput benchmark reads the JPEG decoder's use through Nvml.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from typing import Any

# GPUs with hardware JPEG decoders (NVJPG engines), by model name; NVML says for sure where it can.
HW_JPEG_GPUS = ("A100", "A800", "A30", "H100", "H200", "H800", "H20", "GH200", "B100", "B200", "GB200", "L4")

def environment() -> dict:
    """Versions, driver, GPU and its JPEG decoders, as far as this machine can tell."""
    import torch

    from dali_pipes.graph._dali import dali_version
    from dali_pipes.graph.wheel import installed_wheels
    env: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(), "dali": dali_version(),
        "dali_wheel": ", ".join(f"{name} {version}" for name, version in installed_wheels()) or "none found",
        "driver": nvidia_smi("driver_version") or "none found (no nvidia-smi, or it lists no GPU)",
        "gpus_seen_by_nvidia_smi": nvidia_smi("name")}
    if not env["cuda_available"]:
        return {**env, "gpu": no_gpu_reason(env), "hw_jpeg_decoder": "unknown (no GPU)"}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    env.update(gpu=props.name, compute_capability=f"{props.major}.{props.minor}",
               gpu_memory_gb=round(props.total_memory / 2**30, 1))
    env["hw_jpeg_decoder"] = hardware_jpeg_decoder(props.name)
    return env


def nvidia_smi(query: str) -> str | None:
    """One nvidia-smi field (all GPUs, comma-joined), or None without nvidia-smi or a GPU."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return ", ".join(line.strip() for line in out.stdout.splitlines() if line.strip()) or None


def hardware_jpeg_decoder(gpu_name: str) -> str:
    """"yes (NVML)", "no (NVML)", or the model-name guess when NVML cannot tell."""
    nvml = Nvml.open()
    if nvml is not None and nvml.jpeg_utilization() is not None:
        return "yes (NVML reports JPEG decoder utilisation)"
    if nvml is not None and nvml.jpeg_supported is False:
        return "no (NVML: JPEG decoder utilisation not supported)"
    guess = bool(set(re.split(r"[\s-]+", gpu_name.upper())) & set(HW_JPEG_GPUS))
    return f"{'probably yes' if guess else 'probably no'} (by model name; install nvidia-ml-py to ask NVML)"


class Nvml:
    """Decoder utilisation through NVML (pynvml, from the nvidia-ml-py package), when installed."""

    def __init__(self, pynvml, handle) -> None:
        self.pynvml, self.handle = pynvml, handle
        self.jpeg_supported: bool | None = None  # None: not asked yet

    @classmethod
    def open(cls) -> "Nvml | None":
        """NVML's handle of torch's current GPU, or None (no pynvml, no driver: readings are optional)."""
        try:
            import pynvml
            import torch
            pynvml.nvmlInit()
            device = torch.cuda.current_device()
        except Exception:
            return None
        try:  # by UUID: NVML numbers GPUs without regard to CUDA_VISIBLE_DEVICES
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"))
        except Exception:
            pass
        try:
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByIndex(device))
        except Exception:
            return None

    def jpeg_utilization(self) -> int | None:
        """Percent busy of the hardware JPEG decoder, None where NVML cannot tell."""
        try:
            value = self.pynvml.nvmlDeviceGetJpgUtilization(self.handle)
            self.jpeg_supported = True
            return int(value[0] if isinstance(value, (tuple, list)) else value)
        except AttributeError:  # an older pynvml without the call
            return None
        except Exception:
            self.jpeg_supported = False
            return None

    def readings(self) -> dict:
        out = {"jpeg": self.jpeg_utilization()}
        for key, call in (("video_decoder", "nvmlDeviceGetDecoderUtilization"),
                          ("gpu", "nvmlDeviceGetUtilizationRates")):
            try:
                value = getattr(self.pynvml, call)(self.handle)
                out[key] = int(value.gpu if key == "gpu" else value[0])
            except Exception:
                out[key] = None
        return out


def no_gpu_reason(env: dict) -> str:
    if env.get("gpus_seen_by_nvidia_smi"):
        return (f"nvidia-smi sees {env['gpus_seen_by_nvidia_smi']} but torch {env['torch']} cannot use it "
                f"(built for CUDA {env['torch_cuda']})")
    return f"no GPU: torch {env['torch']} sees no CUDA device (built for CUDA {env['torch_cuda']})"
