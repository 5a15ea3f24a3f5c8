"""`python -m dali_pipes.tools.doctor [--out DIR] [--quick] [--data DIR]`: does the GPU path work here?

On a GPU machine, run this first. It prints torch's CUDA version, DALI's version, the driver, the
GPU and whether it has hardware JPEG decoders, then runs each check below and says, for each,
PASSED, FAILED or NOT CHECKED (and why):
  * DALI's wheel is built for torch's CUDA major (nvidia-dali-cuda120 for CUDA 12, -cuda130 for 13; wheel.py);
  * static graph checks: every graph the library builds for device="gpu" (graph_check.py);
  * a CPU epoch, train and val, through DaliLoader on a tiny dataset;
  * GPU only: the `gpu` tests (pytest -m gpu, with DALI_PIPES_REQUIRE_GPU=1) of a source checkout;
  * GPU only: seconds from DaliLoader(...) to its first batch, and GPU memory, DALI's apart from torch's;
  * GPU only: one epoch of train and val of the built-in dataset at 224 px on the GPU, hybrid
    (CPU decode) and CPU pipelines, compared (val: image by image; train: labels and statistics);
  * GPU only: throughput of DALI gpu at hw_decoder_load 0, 0.65 and 0.99 and of DataLoader + PIL
    (60 s in all), with the hardware JPEG decoder's use read through NVML (pynvml) where available.
It writes doctor.json and doctor.md to the results folder (default: under the cache root,
$DALI_PIPES_CACHE/doctor/<time>), to attach to a bug report, and exits 1 if any check that ran failed.
The throughput run is a benchmark (dali_pipes_bench.doctor_throughput, extra [bench]): the doctor runs
it in a process of its own, which also reads NVML and draws throughput.png, and says when it is missing.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from dali_pipes.tools.environment import environment, no_gpu_reason

PASSED, FAILED, NOT_CHECKED = "PASSED", "FAILED", "NOT CHECKED"
DALI_WHEEL = "DALI wheel fits torch's CUDA"
COSTS = "first batch and GPU memory (DaliLoader, train, 224 px)"
THROUGHPUT = "throughput (DALI gpu at hw_decoder_load 0 / 0.65 / 0.99 vs DataLoader + PIL, NVML decoder use)"


class NotChecked(Exception):
    """A check that does not apply here; the message says why."""


@dataclass
class Check:
    name: str
    status: str
    detail: str = ""
    data: dict = field(default_factory=dict)
    seconds: float = 0.0

    def line(self) -> str:
        return f"{self.status:<12} {self.name}: {self.detail} ({self.seconds:.1f} s)"


def run_check(name: str, check: Callable[[], tuple[str, dict]]) -> Check:
    """Run one check: it returns (detail, data), raises NotChecked, or fails (any other error)."""
    start = time.perf_counter()
    try:
        with dali_deprecations_hidden():
            detail, data = check()
        result = Check(name, PASSED, detail, data)
    except NotChecked as e:
        result = Check(name, NOT_CHECKED, str(e))
    except Exception as e:  # a failed check must not stop the others: it is reported, with its traceback
        result = Check(name, FAILED, f"{type(e).__name__}: {e}"[:2000], {"traceback": traceback.format_exc()})
    result.seconds = time.perf_counter() - start
    print(result.line(), flush=True)
    return result


@contextmanager
def dali_deprecations_hidden() -> Iterator[None]:
    """Warnings shown as usual, but DALI's DeprecationWarnings: DALI 2.4's own auto_aug calls its deprecated aliases
    (fn.experimental.equalize, .filter), nothing a user can change, and DALI turns the warning on where it warns
    (simplefilter("default") inside catch_warnings), so no filter hides it: warnings are recorded, then shown."""
    with warnings.catch_warnings(record=True) as caught:
        yield
    dali = f"{os.sep}nvidia{os.sep}dali{os.sep}"
    for w in caught:
        if not (issubclass(w.category, DeprecationWarning) and dali in w.filename):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


# -- checks that run everywhere ------------------------------------------------------------------------

def tiny_sources(root: str) -> dict:
    """The same 12 small JPEGs (3 classes) as an image folder, TFRecord and WebDataset shards."""
    from PIL import Image

    from dali_pipes import open_source
    from dali_pipes.tools.convert import write_tfrecords, write_webdataset
    for i in range(12):
        folder = os.path.join(root, "folder", f"class_{i % 3}")
        os.makedirs(folder, exist_ok=True)
        ramp = np.add.outer(np.arange(40 + 2 * i), np.arange(56)).astype(np.uint8)
        pixels = np.stack([ramp * 3 + 20 * i, np.full_like(ramp, 11 * i), ramp + 13 * i], axis=-1).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{i:03d}.jpg"), quality=90)
    images = open_source(os.path.join(root, "folder"))
    write_tfrecords(images, os.path.join(root, "tfrecord"), shards=2, workers=1, progress=False)
    write_webdataset(images, os.path.join(root, "webdataset"), shards=2, workers=1, progress=False)
    return {"folder": images, "tfrecord": open_source(os.path.join(root, "tfrecord"), progress=False),
            "webdataset": open_source(os.path.join(root, "webdataset"), progress=False)}


def check_static_graphs(sources: dict) -> tuple[str, dict]:
    """Every project GPU graph, assembled and checked without a GPU."""
    from dali_pipes.tools.graph_check import GraphError, PrivateApiChanged, check_variant, project_graphs
    results, failed = [], []
    for variant in project_graphs(sources):
        try:
            results.append(check_variant(variant).summary())
        except PrivateApiChanged as e:
            raise NotChecked(f"DALI's private graph API changed: {e}") from e
        except GraphError as e:
            failed.append(str(e))
            results.append({"graph": variant.name, "ok": False, "problems": e.problems})
    if failed:
        raise AssertionError(f"{len(failed)} of {len(results)} graphs failed:\n" + "\n".join(failed))
    return f"{len(results)} graphs assembled by DALI and checked", {"graphs": results}


def check_cpu_epoch(sources: dict) -> tuple[str, dict]:
    """One epoch of train and val through DaliLoader on the CPU: counts, shapes, finite values."""
    import torch

    from dali_pipes import DaliLoader
    folder = sources["folder"]
    data = {}
    for train in (True, False):
        loader = DaliLoader(folder, batch_size=4, train=train, device="cpu", num_threads=2, image_size=64)
        labels, expected = [], len(loader) * 4 if train else None
        for images, batch_labels in loader:
            if images.shape[1:] != (3, 64, 64) or not torch.isfinite(images).all():
                raise AssertionError(f"bad batch: shape {tuple(images.shape)}")
            labels += batch_labels.tolist()
        loader.close()
        data["train" if train else "val"] = len(labels)
        real = sorted(label for label in labels if label >= 0)
        if (not train and real != sorted(folder.labels)) or (train and len(labels) != expected):
            raise AssertionError(f"{'train' if train else 'val'} epoch yielded labels {labels}")
    return f"train {data['train']} and val {data['val']} samples, as the epoch contract says", data


# -- checks that need a GPU ------------------------------------------------------------------------------

def require_gpu(env: dict) -> None:
    if not env["cuda_available"]:
        raise NotChecked(no_gpu_reason(env))


def check_torch_sees_gpu(env: dict) -> tuple[str, dict]:
    """A GPU that nvidia-smi lists but torch cannot use is a broken install, not a CPU machine."""
    if env.get("gpus_seen_by_nvidia_smi") and not env["cuda_available"]:
        raise AssertionError(no_gpu_reason(env) + "; install a CUDA build of torch")
    if not env["cuda_available"]:
        raise NotChecked(no_gpu_reason(env))
    return f"{env['gpu']} (compute {env['compute_capability']}), driver {env['driver']}", {}


def check_dali_wheel(torch_cuda: str | None, wheels: list[tuple[str, str]]) -> tuple[str, dict]:
    """DALI's wheel is built for torch's CUDA major (graph/wheel.py); a mismatch fails, naming the wheel."""
    from dali_pipes.graph.wheel import wheel_problem
    problem = wheel_problem(torch_cuda, wheels)
    if problem:
        raise AssertionError(problem)
    name, version = wheels[0]
    pair = f"torch built for CUDA {torch_cuda}" if torch_cuda else "a CPU torch (either DALI wheel runs CPU pipelines)"
    return f"{name} {version} beside {pair}", {"wheel": name, "version": version, "torch_cuda": torch_cuda}


def check_gpu_tests(env: dict) -> tuple[str, dict]:
    """The `gpu` tests of a source checkout, where skips are failures (DALI_PIPES_REQUIRE_GPU=1)."""
    require_gpu(env)
    root = Path(__file__).resolve().parents[1]
    if not (root / "tests" / "conftest.py").exists():
        raise NotChecked(f"no tests beside the package ({root / 'tests'}): run the doctor from a source checkout")
    run = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"],
                         cwd=root, capture_output=True, text=True, env={**os.environ, "DALI_PIPES_REQUIRE_GPU": "1"})
    summary = (run.stdout.strip().splitlines() or ["no output"])[-1]
    if run.returncode != 0:
        raise AssertionError(f"pytest -m gpu: {summary}\n{run.stdout[-3000:]}{run.stderr[-1000:]}")
    return f"pytest -m gpu: {summary}", {"summary": summary}


def builtin_dataset(data: str | None, work: str, quick: bool) -> tuple[str, str]:
    """(train, val) folders of the built-in dataset: `data`, data/sample/images, or made in `work`."""
    from dali_pipes.tools.sample_data import SampleDatasetConfig, make_sample_dataset
    for root in ([data] if data else ["data/sample/images"]):
        if os.path.isdir(os.path.join(root, "train")):
            return os.path.join(root, "train"), os.path.join(root, "val")
    if data:
        raise FileNotFoundError(f"{data}: expected {data}/train and {data}/val (the built-in dataset's layout)")
    root = os.path.join(work, "sample")
    cfg = SampleDatasetConfig(train_per_class=40, val_per_class=10) if quick else SampleDatasetConfig()
    make_sample_dataset(root, cfg, progress=False)
    return os.path.join(root, "train"), os.path.join(root, "val")


def check_costs(env: dict, train_dir: str, batch_size: int) -> tuple[str, dict]:
    """What a GPU loader costs before training starts: seconds from DaliLoader(...) to its first batch
    (stats()["first_batch_s"]), and GPU memory, DALI's apart from torch's (usage.gpu_memory_figures), over its
    first 20 batches. Run before the other GPU checks: DALI's pools never shrink, as a training job meets them."""
    require_gpu(env)
    import torch

    from dali_pipes import DaliLoader
    from dali_pipes.run.usage import PeakSampler, gpu_memory_figures, gpu_used_mb
    before = gpu_used_mb()  # the CUDA context (environment() made it) and other processes
    torch.cuda.reset_peak_memory_stats()
    with PeakSampler(0.02) as sampler:
        loader = DaliLoader(train_dir, batch_size=batch_size, train=True, device="gpu", image_size=224, seed=0)
        batches = iter(loader)
        for _ in range(min(20, len(loader))):
            next(batches)
        first, figures = loader.stats()["first_batch_s"], gpu_memory_figures(sampler, before)
        loader.close()
    data = {"first_batch_s": round(first, 2), "batch_size": batch_size, "gpu_before_loaders_mb": before, **figures}
    return (f"first batch {first:.1f} s after DaliLoader(...) at batch {batch_size}; GPU memory: DALI "
            f"{figures['gpu_dali_peak_mb']} MB, torch {figures['gpu_torch_reserved_peak_mb']} MB reserved"), data


def check_gpu_vs_cpu(env: dict, train_dir: str, val_dir: str) -> tuple[str, dict]:
    """Val at 224 px: GPU and hybrid images match the CPU's within the decoders' rounding, labels
    exactly. Train: the same samples (the reader runs on the CPU with the same seed), and per-channel
    means within 0.15 (crops and flips are drawn on each device)."""
    require_gpu(env)
    data: dict[str, dict] = {"val": {}, "train": {}}
    val = {name: _epoch(val_dir, False, device, decode) for name, device, decode in
           (("cpu", "cpu", None), ("gpu", "gpu", None), ("hybrid", "gpu", "cpu"))}
    for name in ("gpu", "hybrid"):
        if val[name]["labels"] != val["cpu"]["labels"]:
            raise AssertionError(f"val labels differ between {name} and cpu")
        diff = np.abs(val[name]["images"] - val["cpu"]["images"])
        data["val"][name] = {"mean_abs": float(diff.mean()), "p99_abs": float(np.percentile(diff, 99)),
                             "max_abs": float(diff.max())}
        if diff.mean() > 0.05 or np.percentile(diff, 99) > 0.5:
            raise AssertionError(f"val images differ between {name} and cpu: {data['val'][name]}")
    train = {name: _epoch(train_dir, True, device, decode, keep_images=False) for name, device, decode in
             (("cpu", "cpu", None), ("gpu", "gpu", None), ("hybrid", "gpu", "cpu"))}
    for name in ("gpu", "hybrid"):
        drift = np.abs(train[name]["channel_mean"] - train["cpu"]["channel_mean"])
        data["train"][name] = {"labels_equal": train[name]["labels"] == train["cpu"]["labels"],
                               "channel_mean_drift": drift.tolist()}
        if drift.max() > 0.15 or sorted(train[name]["labels"]) != sorted(train["cpu"]["labels"]):
            raise AssertionError(f"train epochs differ between {name} and cpu: {data['train'][name]}")
    worst = max(v["mean_abs"] for v in data["val"].values())
    return f"val mean |GPU - CPU| {worst:.4f} (normalised units; one 8-bit level = 0.017); train agrees", data


def _epoch(folder: str, train: bool, device: str, decode_device: str | None, keep_images: bool = True) -> dict:
    import torch

    from dali_pipes import DaliLoader
    args: dict[str, Any] = dict(decode_device=decode_device) if decode_device else {}
    loader = DaliLoader(folder, batch_size=50, train=train, device=device, image_size=224, seed=0, **args)
    labels, images, sums, count = [], [], torch.zeros(3, dtype=torch.float64), 0
    for batch_images, batch_labels in loader:
        labels += batch_labels.tolist()
        sums += batch_images.double().mean(dim=(2, 3)).sum(dim=0).cpu()
        count += len(batch_labels)
        if keep_images:
            images.append(batch_images.float().cpu().numpy())
    loader.close()
    return {"labels": labels, "images": np.concatenate(images) if images else None,
            "channel_mean": (sums / max(count, 1)).numpy()}


def check_throughput(env: dict, train_dir: str, seconds: float, out: str) -> tuple[str, dict]:
    """The throughput run: a benchmark, so it lives in dali_pipes_bench and runs in a process of its own
    (the library never imports the benchmarks); not checked where that package is not installed."""
    require_gpu(env)
    if importlib.util.find_spec("dali_pipes_bench") is None:
        from dali_pipes.errors import install_hint
        raise NotChecked(f"the throughput run is a benchmark: {install_hint('bench')}, or run the doctor "
                         f"from the checkout")
    result = os.path.join(out, "throughput.json")
    run = subprocess.run([sys.executable, "-m", "dali_pipes_bench.doctor_throughput", train_dir, "--seconds",
                          str(seconds), "--out", out], text=True)
    if run.returncode != 0:
        raise AssertionError(f"python -m dali_pipes_bench.doctor_throughput exited {run.returncode}")
    with open(result) as f:
        data = json.load(f)
    return data["summary"], {"rows": data["rows"]}


# -- results -------------------------------------------------------------------------------------------

def write_results(out: str, env: dict, checks: list[Check], argv: Sequence[str]) -> list[str]:
    """doctor.json and doctor.md (and the throughput run's throughput.png, where it drew one)."""
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, "doctor.json"), os.path.join(out, "doctor.md")]
    with open(paths[0], "w") as f:
        json.dump({"command": "python -m dali_pipes.tools.doctor " + " ".join(argv), "environment": env,
                   "checks": [asdict(c) for c in checks]}, f, indent=1, default=str)
    with open(paths[1], "w") as f:
        f.write(markdown(env, checks, argv))
    plot = os.path.join(out, "throughput.png")
    return paths + ([plot] if os.path.exists(plot) else [])


def markdown(env: dict, checks: list[Check], argv: Sequence[str]) -> str:
    lines = [f"# dali_pipes doctor, {datetime.datetime.now().isoformat(timespec='seconds')}", "",
             f"`python -m dali_pipes.tools.doctor {' '.join(argv)}`", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in env.items()]
    lines += ["", "| result | check | detail | s |", "|---|---|---|---|"]
    lines += [f"| {c.status} | {c.name} | {c.detail.splitlines()[0] if c.detail else ''} | {c.seconds:.1f} |"
              for c in checks]
    for c in checks:
        if c.name == THROUGHPUT and c.status == PASSED:
            lines += ["", "## Throughput (train, 224 px)", "", "| case | images/s | JPEG decoder % mean | GPU % mean |",
                      "|---|---|---|---|"]
            lines += [f"| {r['case']} | {_rate(r)} | {r.get('jpeg_util_mean')} | {r.get('gpu_util_mean')} |"
                      for r in c.data["rows"]]
    return "\n".join(lines) + "\n"


def _rate(row: dict) -> str:
    """A throughput row's images/s: median [min, max] over the protocol's rounds, with its spread."""
    if "min" not in row:
        return str(row["images_per_s"])
    return (f"{row['images_per_s']:,.0f} [{row['min']:,.0f}, {row['max']:,.0f}], spread {row['spread']:.0%}")


# -- the command ---------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    from dali_pipes.options import CommandParser, RawDefaultsFormatter
    parser = CommandParser(prog="python -m dali_pipes.tools.doctor", description=__doc__,
                           formatter_class=RawDefaultsFormatter)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    from dali_pipes.storage.files import cache_root
    parser.add_argument("--out", default=os.path.join(cache_root(), "doctor", stamp),
                        help="results folder (default: under the cache root, %(default)s)")
    parser.add_argument("--quick", action="store_true", help="a smaller built-in dataset and a 20 s throughput run")
    parser.add_argument("--data", default=None, help="the built-in dataset's folder (with train/ and val/); "
                        "default: data/sample/images, else one made in the results folder")
    parser.add_argument("--seconds", type=float, default=None, help="throughput run in all, shared by its 4 cases in "
                        "alternating rounds (default: 120, 30 s a case; quick: 20)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from dali_pipes.graph.wheel import installed_wheels
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    env = environment()
    print("\n".join(f"{k:>24}: {v}" for k, v in env.items()), flush=True)
    checks = [run_check("torch sees the GPU", lambda: check_torch_sees_gpu(env)),
              run_check(DALI_WHEEL, lambda: check_dali_wheel(env["torch_cuda"], installed_wheels()))]
    with tempfile.TemporaryDirectory(prefix="dali-pipes-doctor-") as work:
        sources: dict = {}
        checks.append(run_check("tiny dataset (folder, TFRecord, WebDataset)",
                                lambda: (sources.update(tiny_sources(work)) or "12 images in 3 formats", {})))
        checks.append(run_check("static GPU graph checks", needs(sources, lambda: check_static_graphs(sources))))
        checks.append(run_check("CPU epoch (train and val)", needs(sources, lambda: check_cpu_epoch(sources))))
    checks.append(run_check("gpu tests", lambda: check_gpu_tests(env)))
    checks += gpu_runtime_checks(env, args)
    paths = write_results(args.out, env, checks, argv)
    return report(checks, paths)


def needs(prerequisite, check: Callable[[], tuple[str, dict]], env: dict | None = None) -> Callable:
    """`check`, not checked when `prerequisite` (filled by an earlier check) is empty, or, with
    `env`, when there is no GPU."""
    def run() -> tuple[str, dict]:
        if env is not None:
            require_gpu(env)
        if not prerequisite:
            raise NotChecked("its data could not be made (see the check above)")
        return check()
    return run


def gpu_runtime_checks(env: dict, args: argparse.Namespace) -> list[Check]:
    """The GPU-vs-CPU epoch and the throughput run, on the built-in dataset (made when missing)."""
    splits: list[str] = []

    def dataset() -> tuple[str, dict]:
        require_gpu(env)
        splits.extend(builtin_dataset(args.data, args.out, args.quick))
        return f"train {splits[0]}, val {splits[1]}", {}

    seconds = args.seconds or (20.0 if args.quick else 120.0)  # 30 s a case: the measurement protocol's least
    return [run_check("built-in dataset", dataset),
            run_check(COSTS, needs(splits, lambda: check_costs(env, splits[0], 64 if args.quick else 256), env)),
            run_check("GPU vs CPU outputs", needs(splits, lambda: check_gpu_vs_cpu(env, *splits), env)),
            run_check(THROUGHPUT, needs(splits, lambda: check_throughput(env, splits[0], seconds, args.out), env))]


def report(checks: list[Check], paths: list[str]) -> int:
    """Print what was not checked and where the results are; 1 if any check failed."""
    skipped = [c for c in checks if c.status == NOT_CHECKED]
    failed = [c for c in checks if c.status == FAILED]
    for c in failed:
        print(f"\nFAILED {c.name}:\n{c.data.get('traceback', c.detail)}")
    print(f"\nresults: {', '.join(paths)}")
    print(f"{len(failed)} failed, {len(checks) - len(failed) - len(skipped)} passed, {len(skipped)} not checked"
          + (" (each said why above; a GPU run settles them)" if skipped else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
