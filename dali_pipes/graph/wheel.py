"""Which DALI wheel fits this torch: DALI ships one wheel per CUDA major (nvidia-dali-cuda120 for CUDA 12,
nvidia-dali-cuda130 for CUDA 13). dali_pipes installs it through the extra of torch's CUDA major ('.[cu12]',
'.[cu13]'; either runs a CPU torch's CPU pipelines, and CI uses the CUDA 12 one), matched to torch's
`torch.version.cuda` (the doctor checks the pair and names the command). A wheel of another major still imports, but
puts a second CUDA runtime in the process (the first H100 run had DALI's CUDA 13 wheel beside a package that
declared the CUDA 12 one); two wheels at once share the `nvidia/dali` folder and break each other on uninstall.

Tested pairs: nvidia-dali-cuda120 2.4.0 with torch 2.13.0 (CPU build; CI), nvidia-dali-cuda130 2.4.0 with
torch 2.11 + cu130 (an H100). The doctor reports the check; a missing DALI is named with the wheel to install.
"""

from __future__ import annotations

import importlib.util
import re

from dali_pipes.errors import install_hint

DALI_WHEEL = re.compile(r"^nvidia[-_.]dali[-_.]cuda(\d+)$", re.IGNORECASE)  # cuda120: built for CUDA 12.0


def cuda_major(version: str) -> int:
    """12 of "12.8", 13 of "13.0"."""
    return int(str(version).split(".")[0])


def wheel_cuda_major(name: str) -> int:
    """The CUDA major a DALI wheel is built for, from its distribution name: 12 of nvidia-dali-cuda120."""
    match = DALI_WHEEL.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a DALI wheel name (nvidia-dali-cudaXY0)")
    return int(match.group(1)) // 10


def install_command(torch_cuda: str | None) -> str:
    """What to install for a torch built for CUDA `torch_cuda` (None: a CPU build, which runs DALI's CPU
    pipelines with either wheel: the CUDA 12 one, which CI tests)."""
    major = cuda_major(torch_cuda) if torch_cuda else 12
    return f"pip install nvidia-dali-cuda{major}0"


def extra_for(torch_cuda: str | None) -> str:
    """dali_pipes' extra that installs the DALI wheel for a torch built for CUDA `torch_cuda` (None: CPU)."""
    return "cu13" if torch_cuda and cuda_major(torch_cuda) >= 13 else "cu12"


def installed_wheels() -> list[tuple[str, str]]:
    """(distribution name, version) of each DALI wheel installed, normally one."""
    from importlib import metadata
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if DALI_WHEEL.match(name):
            found[name.lower().replace("_", "-").replace(".", "-")] = dist.version
    return sorted(found.items())


def wheel_problem(torch_cuda: str | None, wheels: list[tuple[str, str]]) -> str | None:
    """What is wrong with the DALI `wheels` installed (installed_wheels()) beside a torch built for CUDA
    `torch_cuda` (torch.version.cuda; None: a CPU build), with the command that fixes it; None when they fit."""
    torch_text = f"torch built for CUDA {torch_cuda}" if torch_cuda else "a CPU build of torch"
    fix = install_command(torch_cuda)
    if not wheels:
        return f"no DALI wheel is installed; for {torch_text}: {fix}"
    listed = ", ".join(f"{name} {version}" for name, version in wheels)
    if len(wheels) > 1:
        return (f"{len(wheels)} DALI wheels are installed ({listed}): they share the nvidia/dali folder. "
                f"pip uninstall -y {' '.join(name for name, _ in wheels)}, then, for {torch_text}: {fix}")
    name, version = wheels[0]
    if torch_cuda is None or wheel_cuda_major(name) == cuda_major(torch_cuda):
        return None
    return (f"{listed} is DALI built for CUDA {wheel_cuda_major(name)}, beside {torch_text}: two CUDA runtimes in "
            f"one process, a pair nobody tested. pip uninstall -y {name}, then: {fix}")


def require_dali() -> None:
    """Raise ModuleNotFoundError naming the wheel to install when DALI is missing (uninstalled, or installed
    with --no-deps)."""
    try:
        found = importlib.util.find_spec("nvidia.dali") is not None
    except ModuleNotFoundError:  # no `nvidia` package at all
        found = False
    if not found:
        import torch
        raise ModuleNotFoundError(f"NVIDIA DALI is not installed; {wheel_problem(torch.version.cuda, [])} "
                                  f"(or {install_hint(extra_for(torch.version.cuda))})", name="nvidia.dali")
