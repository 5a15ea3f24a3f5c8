"""timm's Python classes for the tests (Mixup, FastCollateMixup, RandomErasing), without making the library or
the venv depend on it: the wheel is installed with ``--no-deps`` into a side folder outside the repository, as
tests/torchvision_side.py does for torchvision (whose side install timm imports). timm's other dependencies
(huggingface_hub, safetensors, pyyaml) are in the venv already. Nothing here is imported by ``dali_pipes``.

Use: ``from timm_side import timm  # noqa: F401`` in tests/conftest.py, then ask for the ``timm`` fixture
(it skips when the wheel cannot be had, e.g. no registry).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

from torchvision_side import import_torchvision, install, side_folder

TIMM_SERIES = "1.0"  # Mixup's and RandomErasing's attributes as read by dali_pipes/run/batch_mix.py, transforms.py


def import_timm(cache_dir: str | None = None) -> types.ModuleType:
    """Install (once) and import timm.data (mixup, random_erasing); returns the timm module."""
    if "timm" in sys.modules:
        return sys.modules["timm"]
    import_torchvision(cache_dir)
    folder = side_folder(TIMM_SERIES, cache_dir).replace("torchvision-side", "timm-side")
    install(folder, TIMM_SERIES, package="timm")
    if folder not in sys.path:
        sys.path.append(folder)
    module = importlib.import_module("timm")
    importlib.import_module("timm.data.mixup")
    importlib.import_module("timm.data.random_erasing")
    return module


@pytest.fixture(scope="session")
def timm() -> types.ModuleType:
    """The timm module (timm.data.mixup and random_erasing imported); skips when it cannot be had."""
    try:
        return import_timm()
    except subprocess.CalledProcessError as e:
        last_line = "".join((e.stderr or "").strip().splitlines()[-1:]) or str(e)
        pytest.skip(f"could not pip-install timm {TIMM_SERIES}.* into a side folder (no registry?): {last_line}")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"timm side install unusable here: {type(e).__name__}: {e}")
