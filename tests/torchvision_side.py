"""torchvision's Python classes for the tests, without making the library or the venv depend on it.

PyPI has no CPU torchvision wheel for torch 2.13 (only the CUDA one, whose compiled ``_C.so`` needs
libtorch_cuda), so the tests install that wheel with ``--no-deps`` into a side folder outside the
repository and use only its pure-Python parts: datasets, transforms (v1 and v2), PIL-based CPU work.
Nothing here is imported by ``dali_pipes``; the stubs below live only in the test process.

Use: ``from torchvision_side import torchvision  # noqa: F401`` in tests/conftest.py, then ask for the
``torchvision`` fixture (it skips when the wheel cannot be had, e.g. no registry).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import types

import pytest
import torch

from dali_pipes_bench.detection import STUBBED  # torchvision's modules that need its compiled ops, stubbed

_MARKER = ".installed"  # written last, so a half-finished install is never reused


def torchvision_version() -> str:
    """The torchvision series paired with the running torch: 2.N pairs with 0.(N+15), e.g. 2.13 -> 0.28.

    (The 0.28.0 wheel's metadata says Requires-Dist: torch==2.13.0.)
    """
    major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if major != 2:
        raise RuntimeError(f"no known torchvision pairing for torch {torch.__version__}")
    return f"0.{minor + 15}"


def side_folder(version: str, cache_dir: str | None = None) -> str:
    """Where the wheel goes: CACHE_DIR, else $DALI_PIPES_CACHE, else ~/.cache/dali_pipes (never the repo)."""
    root = cache_dir or os.environ.get("DALI_PIPES_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "dali_pipes")
    return os.path.join(root, "torchvision-side", version)


def install(folder: str, version: str, package: str = "torchvision") -> None:
    """pip install --no-deps --target into a temporary sibling, then rename: parallel runs never see half.
    (tests/timm_side.py installs timm the same way.)"""
    if os.path.exists(os.path.join(folder, _MARKER)):
        return
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".staging-", dir=os.path.dirname(folder))
    try:
        # --no-deps: its one dependency we lack is torch==2.13.0 (we have 2.13.0+cpu), which must stay.
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                        "--target", staging, f"{package}=={version}.*"],
                       check=True, capture_output=True, text=True, timeout=600)
        with open(os.path.join(staging, _MARKER), "w") as f:
            f.write(f"{package}=={version}.* for torch {torch.__version__}\n")
        try:
            os.rename(staging, folder)
        except OSError:  # another process got there first (or a stale unmarked folder is in the way)
            if not os.path.exists(os.path.join(folder, _MARKER)):
                shutil.rmtree(folder, ignore_errors=True)
                os.rename(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def import_torchvision(cache_dir: str | None = None) -> types.ModuleType:
    """Install (once) and import torchvision with datasets and transforms; returns the torchvision module."""
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    version = torchvision_version()
    folder = side_folder(version, cache_dir)
    install(folder, version)
    if folder not in sys.path:
        sys.path.append(folder)  # appended: a real torchvision in the venv, if any ever is, still wins
    for name in STUBBED:
        # An empty module in sys.modules satisfies `from torchvision import _meta_registrations`.
        sys.modules.setdefault(name, types.ModuleType(name))
    module = importlib.import_module("torchvision")
    importlib.import_module("torchvision.datasets")
    importlib.import_module("torchvision.transforms")
    return module


def torchvision_available(cache_dir: str | None = None) -> bool:
    """True when import_torchvision works here (installing the wheel if it must)."""
    try:
        import_torchvision(cache_dir)
    except Exception:  # noqa: BLE001 - any failure means "not available", the fixture says why
        return False
    return True


@pytest.fixture(scope="session")
def torchvision() -> types.ModuleType:
    """The torchvision module (datasets and transforms imported); skips when it cannot be had."""
    try:
        return import_torchvision()
    except subprocess.CalledProcessError as e:
        last_line = "".join((e.stderr or "").strip().splitlines()[-1:]) or str(e)
        pytest.skip(f"could not pip-install torchvision {torchvision_version()}.* into a side folder "
                    f"(no registry?): {last_line}")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"torchvision side install unusable with torch {torch.__version__}: "
                    f"{type(e).__name__}: {e}")
