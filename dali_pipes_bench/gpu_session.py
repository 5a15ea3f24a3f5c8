"""One prepared run on a lent GPU machine, over the fewest calls (issue 33); and its dry run on CPU.

A lent machine has 15 minutes of device time in all, 64 MiB carried and 10 minutes per call, and 8 files back.
The wheels it lacks come as parts (gpu_pack.py), one a call; the calls follow each other within the 30 s the
machine stays warm, so /tmp and detached processes survive between them.

    python scripts/gpu/device_run.py receive 0     # call 1: part-00, early.tar and the manifest; installs the
                                                   # early wheels and starts the data generation, detached (setsid)
    python scripts/gpu/device_run.py receive N     # calls 2..: part N
    python scripts/gpu/device_run.py receive K && python scripts/gpu/device_run.py run
                                                   # the last call: its part, then reassemble, check, install,
                                                   # run every step, write $OUT

`run` checks the archive's sha256 against the manifest, installs the wheels with pip (--no-index --no-deps
--target WORK/site), then runs STEPS in order, most important first (the first that reads the data of call 1
waits for it), each under its own budget in seconds and within the run's deadline: a step that runs out is
stopped (its whole process group) and its line says "cut"; the steps after it still run. It writes at most 8
files to $OUT (OUT_FILES): results.jsonl (a line per step: status, seconds, budget, command and the JSON it
wrote), session.log (every step's output), env.json (GPU, driver, CUDA, torch, DALI, codec versions) and
commands.sh (every command, to run again by hand).

`--dry-run` is the same code on CPU: tiny data, a fake part set (any files packed by gpu_pack.pack_files),
each GPU-only step reported as "skipped: no GPU", the agreement and stress checks with the CPU graph as the
candidate. tests/test_gpu_session.py runs it end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dali_pipes_bench.gpu_pack import EARLY, MANIFEST, sha256

DALI = "DaliLoader"  # dali_pipes_bench.detection's name of DaliLoader's case and feed (imported there: torch)

ROOT = Path(__file__).resolve().parent.parent  # the checkout the device call sent
OUT_FILES = ("results.jsonl", "session.log", "env.json", "commands.sh")  # the device returns 8 files at most
DEADLINE_S = 510.0  # the run's steps end by then: a call has 600 s, and reassembly and install come first
CUT, SKIPPED, PASSED, FAILED = "cut", "skipped", "ok", "failed"


@dataclass(frozen=True)
class Step:
    """One step of the run: a command, its budget in seconds, the JSON it writes (if any), and whether it
    needs a GPU. `dry` is the command of the dry run (None: the GPU command, on tiny data)."""
    name: str
    budget_s: float
    argv: tuple[str, ...]
    gpu: bool = True
    result: str = ""
    dry: tuple[str, ...] | None = None
    data: bool = True  # reads the data of call 1: the run waits for it before the first such step
    env: tuple[tuple[str, str], ...] = ()  # more environment for this step
    empty: tuple[str, ...] = ()  # folders emptied (made) before the step: a tuning memory that starts empty


@dataclass(frozen=True)
class Paths:
    """Where a session keeps its things on the device (or in a test's temporary folder)."""
    work: Path

    @property
    def parts(self) -> Path:
        return self.work / "parts"

    @property
    def site(self) -> Path:
        return self.work / "site"

    @property
    def data(self) -> Path:
        return self.work / "data"

    @property
    def detection(self) -> Path:
        return self.work / "detection"

    @property
    def hard(self) -> Path:
        return self.work / "hard"

    @property
    def data_done(self) -> Path:
        return self.work / "data.done"


def data_command(paths: Paths, dry_run: bool) -> list[str]:
    """The data generation of call 1: the benchmark set (folder + 64 TFRecord shards), the hard images, and the
    detection set (COCO JSON + images of COCO's sizes, 400-640 px sides; 4,000 take about 5 s on 16 cores)."""
    py = shlex.quote(sys.executable)
    size = ("--classes 2 --train-per-class 4 --val-per-class 2 --tfrecord-shards 2" if dry_run else
            "--classes 1000 --train-per-class 50 --val-per-class 10 --tfrecord-shards 64")
    hard = 16 if dry_run else 10000
    detection = ("--train-images 8 --min-side 64 --max-side 96" if dry_run else
                 "--train-images 4000 --min-side 400 --max-side 640")
    script = (f"{py} -m dali_pipes sample {paths.data} {size} && "
              f"{py} -m dali_pipes_bench.gpu_agreement make {paths.hard} --images {hard} && "
              f"{py} -m dali_pipes sample {paths.detection} --detection --val-images 0 {detection}; "
              f"echo $? > {paths.data_done}")
    return ["bash", "-c", script]


def steps(paths: Paths) -> list[Step]:
    """Everything the run does, most important first (issue 33's order: the GPU features, throughput, training,
    the costs users see; issue 35's detection figures after the classification throughput). The budgets add up
    to DEADLINE_S (docs/gpu.md's plan)."""
    cost = _cost_steps(paths)
    return _feature_steps(paths) + cost[:1] + _detection_steps(paths) + cost[1:]


def _detection_steps(paths: Paths) -> list[Step]:
    """Issue 35 on the GPU: DaliLoader against DataLoader + PIL (16 cores each side, workers swept) at the
    references' Faster R-CNN (hflip, batch 2) and SSDlite (batch 24) settings; then SSDlite320's training step's
    data wait, fed by each."""
    py, work, data = sys.executable, paths.work, str(paths.detection)
    bench = (py, "-m", "dali_pipes_bench.detection", "--data", data, "--presets", "hflip", "ssdlite")
    tiny = ("--device", "cpu", "--threads", "1")
    train = (py, "-m", "dali_pipes_bench.detection_training", "--data", data)
    return [
        Step("detection", 40, (*bench, "--device", "gpu", "--batch-size", "2", "ssdlite=24", "--workers", "4", "8",
                               "16", "--rounds", "3", "--min-seconds", "5", "--min-epochs", "0",
                               "--out", f"{work}/detection.json"), result=f"{work}/detection.json",
             dry=(*bench, *tiny, "--batch-size", "2", "--workers", "1", "--rounds", "1", "--min-seconds", "0",
                  "--min-epochs", "0", "--out", f"{work}/detection.json")),
        Step("detection-training", 20, (*train, "--device", "gpu", "--batch-size", "24", "--steps", "40",
                                        "--warmup", "5", "--workers", "16", "--out", f"{work}/detection-training.json"),
             result=f"{work}/detection-training.json",
             # on CPU one step takes seconds (SSDlite's backward): one step of DaliLoader's feed checks the loop
             dry=(*train, *tiny, "--feeds", DALI, "--batch-size", "2", "--steps", "1", "--warmup", "0",
                  "--out", f"{work}/detection-training.json")),
    ]


def _feature_steps(paths: Paths) -> list[Step]:
    """The GPU features first: the gpu-marked tests, the decoders' agreement and stress, the features' table."""
    py, work, hard = sys.executable, paths.work, str(paths.hard)
    agree = ("-m", "dali_pipes_bench.gpu_agreement")
    pytest = (py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rfE")
    return [
        Step("gpu-features", 45, (*pytest, f"--junitxml={work}/gpu-features.xml", FEATURE_TESTS), data=False),
        Step("gpu-tests", 40, (*pytest, f"--junitxml={work}/gpu-tests.xml", f"--ignore={FEATURE_TESTS}", "tests"),
             data=False),
        Step("agreement", 50, (py, *agree, "check", hard, "--loads", "0,0.65,0.99", "--out", f"{work}/agreement.json"),
             result=f"{work}/agreement.json",
             dry=(py, *agree, "check", hard, "--device", "cpu", "--loads", "0", "--batch", "8", "--image-size", "32",
                  "--out", f"{work}/agreement.json")),
        Step("stress", 25, (py, *agree, "stress", hard, "--iterations", "200", "--loads", "0.65,0.99",
                            "--out", f"{work}/stress.json"), result=f"{work}/stress.json",
             dry=(py, *agree, "stress", hard, "--device", "cpu", "--iterations", "3", "--batch", "8",
                  "--image-size", "32", "--out", f"{work}/stress.json")),
        Step("features", 5, (py, "-m", "dali_pipes_bench.gpu_session", "features", f"{work}/gpu-features.xml",
                             "--out", f"{work}/features.json"), gpu=False, result=f"{work}/features.json"),
    ]


def _cost_steps(paths: Paths) -> list[Step]:
    """Then throughput (warm, its ceiling, cold), training, and the costs users see: epochs, start-up, memory."""
    py, work, data = sys.executable, paths.work, paths.data
    train, val = str(data / "train"), str(data / "val")
    put = ("-m", "dali_pipes_bench.doctor_throughput")
    tiny = ("--device", "cpu", "--batch-size", "4", "--rounds", "1", "--min-seconds", "0.2", "--min-epochs", "0")
    empty_cache = f"{work}/empty-tuning-cache"
    return [
        Step("throughput", 75, (py, *put, train, "--loads", "0.65,0.99,auto", "--baseline-workers", "16",
                                "--baseline-files", "10000", "--seconds", "60", "--min-epochs", "0",
                                "--out", f"{work}/throughput"),
             result=f"{work}/throughput/throughput.json"),
        Step("ceiling", 25, (py, *put, train, "--decode-only", "--loads", "1.0,0.99,0.65,0", "--baseline-workers",
                             "0", "--seconds", "20", "--min-epochs", "0", "--out", f"{work}/ceiling"),
             result=f"{work}/ceiling/throughput.json",
             dry=(py, *put, train, "--decode-only", "--loads", "1.0", "--baseline-workers", "0", *tiny,
                  "--out", f"{work}/ceiling")),
        Step("throughput-cold", 35, (py, *put, train, "--cold", "--loads", "0.65,0.99,auto", "--baseline-workers",
                                     "0", "--seconds", "28", "--min-epochs", "0", "--out", f"{work}/cold"),
             result=f"{work}/cold/throughput.json",
             dry=(py, *put, train, "--cold", "--loads", "auto", "--baseline-workers", "1", "--baseline-files",
                  "4", *tiny, "--out", f"{work}/cold")),
        Step("epochs", 25, (py, "-m", "dali_pipes_bench.epochs", "--data", train, "--device", "gpu",
                            "--min-seconds", "5", "--min-epochs", "0", "--out", f"{work}/epochs.json"),
             result=f"{work}/epochs.json"),
        Step("training", 60, (py, "-m", "dali_pipes_bench.training", "--data", train, "--arch", "resnet50",
                              "--batch-size", "256", "--channels-last", "--steps", "60", "--feeds", "ideal,DALI gpu",
                              "--num-threads", "auto", "--hw-decoder-load", "auto", "--out", f"{work}/training"),
             env=(("DALI_PIPES_CACHE", empty_cache),), empty=(empty_cache,)),
        Step("startup", 20, (py, "-m", "dali_pipes_bench.startup", "--data", train, "--quick",
                             "--out", f"{work}/startup.json"), result=f"{work}/startup.json"),
        Step("memory", 30, (py, "-m", "dali_pipes_bench.startup", "--data", val, "--val-data", val, "--epochs", "3",
                            "--cases", "imagenet,data", "--rounds", "1", "--batch-size", "256",
                            "--out", f"{work}/memory.json"), result=f"{work}/memory.json"),
        # last: it repeats the gpu tests and a throughput run, so it gets what time is left; its log still tells
        Step("doctor", 15, (py, "-m", "dali_pipes.tools.doctor", "--quick", "--out", f"{work}/doctor"),
             gpu=False, result=f"{work}/doctor/doctor.json", data=False),  # on CPU it checks what applies
    ]


# -- receiving parts ------------------------------------------------------------------------------------------

def receive(n: int, carried: Path, paths: Paths, dry_run: bool = False) -> str:
    """Copy part N (and with part 0 the manifest and early.tar) from the carried folder into WORK/parts,
    checked against the manifest; part 0 also installs the early wheels and starts the data generation."""
    paths.parts.mkdir(parents=True, exist_ok=True)
    if n == 0:
        for name in (MANIFEST, EARLY):
            _copy(carried / name, paths.parts / name)
    manifest = json.loads((paths.parts / MANIFEST).read_text())
    part = manifest["parts"][n]
    landed = paths.parts / (part["name"] + ".partial")  # a part that fails its check is never taken as here
    _copy(carried / part["name"], landed)
    if sha256(landed) != part["sha256"]:
        landed.unlink()
        raise ValueError(f"{carried / part['name']}: sha256 differs from {MANIFEST}'s; pack again "
                         f"(python scripts/gpu/pack.py) and carry the new parts")
    landed.replace(paths.parts / part["name"])
    if n == 0:
        install(paths.parts / EARLY, paths)
        start_data(paths, dry_run)
    have = sum((paths.parts / p["name"]).exists() for p in manifest["parts"])
    return f"{part['name']}: {part['bytes']} bytes, sha256 checked; {have} of {len(manifest['parts'])} parts here"


def _copy(src: Path, dst: Path) -> None:
    if not src.exists():
        raise FileNotFoundError(f"{src}: not carried; name it in the call's carry list (docs/gpu.md, 'A GPU session')")
    shutil.copyfile(src, dst)


def install(archive: Path, paths: Paths) -> list[str]:
    """Unpack `archive` (tar, or tar.xz) and pip-install its wheels into WORK/site, offline, without deps."""
    unpacked = paths.work / "wheels"
    unpacked.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:  # "r:*": plain or xz alike
        tar.extractall(unpacked, filter="data")
        names = tar.getnames()
    wheels = [str(unpacked / n) for n in names if n.endswith(".whl")]
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(paths.site), *wheels], check=True)
    return names


def start_data(paths: Paths, dry_run: bool) -> None:
    """The data generation, detached in a session of its own (setsid), so that it outlives this call."""
    paths.data_done.unlink(missing_ok=True)
    with open(paths.work / "data.log", "wb") as log:
        subprocess.Popen(data_command(paths, dry_run), cwd=ROOT, env=step_env(paths), stdout=log,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def step_env(paths: Paths) -> dict[str, str]:
    """The steps' environment: the installed wheels and this checkout first on the path; skips are failures."""
    path = os.pathsep.join([str(paths.site), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, "DALI_PIPES_REQUIRE_GPU": "1", "PYTHONUNBUFFERED": "1"}


def reassemble(paths: Paths) -> dict:
    """Join the parts, check the archive's sha256 and install its wheels; returns a results line."""
    manifest = json.loads((paths.parts / MANIFEST).read_text())
    missing = [p["name"] for p in manifest["parts"] if not (paths.parts / p["name"]).exists()]
    if missing:
        raise FileNotFoundError(f"{paths.parts}: missing {', '.join(missing)}; each call carries one part "
                                f"(receive N) and the machine must stay warm between calls (30 s)")
    archive = paths.work / "wheels.tar.xz"
    with open(archive, "wb") as out:
        for p in manifest["parts"]:
            out.write((paths.parts / p["name"]).read_bytes())
    if sha256(archive) != manifest["archive_sha256"]:
        raise ValueError(f"{archive}: sha256 of the joined parts differs from {MANIFEST}'s")
    names = install(archive, paths)
    return {"step": "install", "status": PASSED, "files": names, "versions": manifest.get("versions", {})}


# -- running the steps ------------------------------------------------------------------------------------------

def run_step(step: Step, budget: float, env: dict, log, dry_run: bool, has_gpu: bool) -> dict:
    """Run one step under `budget` seconds; its line for results.jsonl."""
    argv = step.dry if dry_run and step.dry else step.argv
    line = {"step": step.name, "budget_s": budget, "command": shlex.join(argv)}
    if step.gpu and not has_gpu and not (dry_run and step.dry):
        return {**line, "status": SKIPPED, "reason": "skipped: no GPU"}
    if budget < 1:
        return {**line, "status": CUT, "reason": "cut: no time left in the run's deadline"}
    for folder in step.empty:
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
    env = {**env, **dict(step.env)}
    log.write(f"\n===== {step.name} (budget {budget:.0f} s): {line['command']}\n".encode())
    log.flush()
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:  # a missing program fails its step, not the run
        return {**line, "status": FAILED, "reason": f"{type(e).__name__}: {e}"}
    try:
        rc = proc.wait(timeout=budget)
        status = PASSED if rc == 0 else FAILED
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the step's whole process group: its workers too
        rc, status = proc.wait(), CUT
    seconds = round(time.monotonic() - start, 2)
    line.update(status=status, rc=rc, seconds=seconds)
    if status == CUT:
        line["reason"] = f"cut: ran out of its {budget:.0f} s budget"
    if step.result and Path(step.result).is_file():
        try:
            line["result"] = json.loads(Path(step.result).read_text())
        except ValueError as e:
            line["result_error"] = f"{step.result}: {e}"
    log.write(f"----- {step.name}: {line.get('reason', status)} after {seconds} s\n".encode())
    return line


def wait_for_data(paths: Paths, budget: float) -> dict:
    """The data generation started by call 1: done, failed, or still running after `budget` seconds."""
    start = time.monotonic()
    while not paths.data_done.exists() and time.monotonic() - start < budget:
        time.sleep(0.5)
    line = {"step": "data", "budget_s": budget, "seconds": round(time.monotonic() - start, 2),
            "command": shlex.join(data_command(paths, False))}
    if not paths.data_done.exists():
        return {**line, "status": CUT, "reason": f"cut: the data generation was not done after {budget:.0f} s"}
    rc = int(paths.data_done.read_text().strip() or 1)
    return {**line, "status": PASSED if rc == 0 else FAILED, "rc": rc}


def environment_report(env: dict) -> dict:
    """env.json's content, read in a process with the installed wheels on its path (`env` action)."""
    report = subprocess.run([sys.executable, "-m", "dali_pipes_bench.gpu_session", "env"], env=env, cwd=ROOT,
                            capture_output=True, text=True)
    try:
        return json.loads(report.stdout)
    except ValueError:
        return {"cuda_available": False, "error": report.stderr[-2000:]}


def run(paths: Paths, out: Path, dry_run: bool = False, budgets: dict[str, float] | None = None,
        deadline_s: float = DEADLINE_S) -> list[dict]:
    """The last call: reassemble and install, wait for the data, run every step; write OUT_FILES to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    start, env, lines = time.monotonic(), step_env(paths), []
    with open(out / "session.log", "wb") as log:
        lines.append(_guarded("install", lambda: reassemble(paths)))
        report = {**environment_report(env), "dry_run": dry_run}  # after the install: the versions that run
        waited = False
        for step in steps(paths):
            if step.data and not waited:  # the steps before it ran while the data was being made
                waited = True
                lines.append(wait_for_data(paths, min(120.0, deadline_s - (time.monotonic() - start))))
            left = deadline_s - (time.monotonic() - start)
            budget = min((budgets or {}).get(step.name, step.budget_s), max(0.0, left))
            lines.append(run_step(step, budget, env, log, dry_run, report["cuda_available"] is True))
    write_outputs(out, lines, env, paths, report)
    return lines


def _guarded(name: str, work) -> dict:
    try:
        return work()
    except (OSError, ValueError, subprocess.CalledProcessError) as e:
        return {"step": name, "status": FAILED, "reason": f"{type(e).__name__}: {e}"}


def write_outputs(out: Path, lines: list[dict], env: dict, paths: Paths, report: dict) -> None:
    """results.jsonl, env.json and commands.sh beside session.log: OUT_FILES, never more than 8 files."""
    dry_run = report["dry_run"]
    with open(out / "results.jsonl", "w") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    (out / "env.json").write_text(json.dumps(report, indent=1))
    commands = [shlex.join(data_command(paths, dry_run))] + [shlex.join(s.dry if dry_run and s.dry else s.argv)
                                                             for s in steps(paths)]
    (out / "commands.sh").write_text("#!/usr/bin/env bash\n# every command of the run, in order (docs/gpu.md)\n"
                                     f"export PYTHONPATH={shlex.quote(env['PYTHONPATH'])} DALI_PIPES_REQUIRE_GPU=1\n"
                                     + "\n".join(commands) + "\n")
    written = sorted(p.name for p in out.iterdir())
    if len(written) > 8:
        raise RuntimeError(f"{out}: {len(written)} files, more than the 8 a device call returns: {written}")


# -- reports: the environment, and which GPU features a test ran ------------------------------------------------

FEATURE_TESTS = "tests/test_gpu_features.py"
FEATURES = {  # issue 33's GPU features -> the test of each (its gpu variant runs in the gpu-features step)
    "mixup/cutmix on the device": "test_mixup_cutmix_on_the_device",
    "random erasing": "test_random_erasing_on_the_device",
    "augmix": "test_augmix_on_the_device",
    "val cache in device memory": "test_val_cache_in_device_memory",
    "drawn sampler (WeightedRandomSampler)": "test_drawn_sampler_feeds_the_graph_in_dataloaders_order",
    "progressive resizing rebuild": "test_progressive_resizing_size_change_rebuilds",
    "hybrid decode": "test_hybrid_decode_gives_the_cpu_graphs_batches",
    "parquet feeding GPU decode": "test_parquet_feeds_the_decode",
    "s3 shard cache feeding GPU decode": "test_s3_shard_cache_feeds_the_decode",
    "mid-epoch resume": "test_mid_epoch_resume",
    'hw_decoder_load="auto"': "test_hw_decoder_load_auto",
}


def features(junit: Path) -> dict:
    """Per GPU feature: its test's gpu variant (tests/test_gpu_features.py::NAME[gpu]) in the junit file of
    the gpu-features step: "passed", "failed" (with the message), "skipped" (with the reason) or "not run"."""
    import xml.etree.ElementTree as ET
    if not junit.exists():
        return {"error": f"{junit}: missing (the gpu-features step did not run)"}
    cases = {c.get("name"): c for c in ET.parse(junit).iter("testcase")
             if (c.get("classname") or "").endswith("test_gpu_features")}
    report = {}
    for feature, test in FEATURES.items():
        case = cases.get(f"{test}[gpu]")
        outcome = None if case is None else next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        name = f"{FEATURE_TESTS}::{test}[gpu]"
        if case is None:
            report[feature] = {"test": name, "status": "not run"}
        elif outcome is None:
            report[feature] = {"test": name, "status": "passed", "seconds": float(case.get("time") or 0)}
        else:
            status = "skipped" if outcome.tag == "skipped" else "failed"
            report[feature] = {"test": name, "status": status, "message": (outcome.get("message") or "")[:300]}
    return report


def environment() -> dict:
    """GPU, driver, CUDA, torch, DALI and the codec libraries' versions, as installed."""
    from importlib import metadata

    from dali_pipes.tools.environment import environment as doctor_environment
    env = doctor_environment()
    for name in ("nvidia-dali-cuda130", "nvidia-dali-cuda120", "nvidia-nvimgcodec-cu13", "nvidia-libnvcomp-cu13",
                 "nvidia-nvjpeg", "nvidia-nvjpeg2k-cu13", "nvidia-nvtiff-cu13", "torchvision", "pycocotools"):
        try:
            env[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            env[name] = None
    return env


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/gpu/device_run.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("receive", "run", "env", "features"))
    parser.add_argument("arg", nargs="?", help="receive: the part's number; features: the junit file")
    parser.add_argument("--carried", default=str(ROOT / ".device-wheels"), help="the carried parts' folder")
    parser.add_argument("--work", default="/tmp/gpu-session", help="the session's folder on the device")
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-out"), help="results folder (default: $OUT)")
    parser.add_argument("--dry-run", action="store_true", help="on CPU: tiny data, GPU-only steps skipped")
    parser.add_argument("--budget", action="append", default=[], metavar="STEP=SECONDS", help="a step's budget")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds for all steps together")
    args = parser.parse_args(argv)
    paths = Paths(Path(args.work))
    if args.action == "receive":
        print(receive(int(args.arg or 0), Path(args.carried), paths, args.dry_run))
    elif args.action == "run":
        budgets = {k: float(v) for k, v in (b.split("=", 1) for b in args.budget)}
        lines = run(paths, Path(args.out), args.dry_run, budgets, args.deadline)
        for line in lines:
            print(f"{line['step']:>12}: {line.get('reason', line['status'])} {line.get('seconds', '')}")
    elif args.action == "env":
        print(json.dumps(environment()))
    else:
        result = features(Path(args.arg or ""))
        print(json.dumps(result, indent=1))
        if args.out:
            Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
