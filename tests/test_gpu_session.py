"""The prepared GPU session (issue 33) rehearsed on CPU: the packer, the device script's dry run end to end,
and the GPU-against-CPU agreement and stress checks with the CPU graph as the candidate."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dali_pipes_bench import gpu_agreement, gpu_pack, gpu_session

ROOT = Path(__file__).resolve().parent.parent


def tiny_wheel(folder: Path) -> Path:
    """A real, deflated wheel of one module, `gpu_session_fake` (pip installs it offline)."""
    import base64
    import hashlib
    import zipfile
    info = "gpu_session_fake-0.1.dist-info"
    members = {"gpu_session_fake/__init__.py": b"VALUE = 33\n" * 50,
               f"{info}/METADATA": b"Metadata-Version: 2.1\nName: gpu-session-fake\nVersion: 0.1\n",
               f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = lambda data: base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record = "".join(f"{name},sha256={digest(data)},{len(data)}\n" for name, data in members.items())
    members[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "gpu_session_fake-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return wheel


def fake_parts(tmp_path: Path, part_bytes: int = 4096) -> tuple[Path, dict]:
    """A fake part set: a tiny wheel and random (incompressible) files, packed by the packer into several parts."""
    files = [tiny_wheel(tmp_path / "files")]
    for i in range(3):
        (f := tmp_path / "files" / f"blob-{i}.bin").parent.mkdir(exist_ok=True)
        f.write_bytes(np.random.default_rng(i).integers(0, 256, 5000, np.uint8).tobytes())
        files.append(f)
    carried = tmp_path / "carried"
    manifest = gpu_pack.pack_files(files, carried, part_bytes, versions={"nvidia-dali-cuda130": "fake"}, preset=1)
    return carried, manifest


def test_the_packer_splits_into_checked_parts_that_fit_a_call(tmp_path):
    carried, manifest = fake_parts(tmp_path)
    parts = sorted(carried.glob("part-*"))
    assert len(parts) == len(manifest["parts"]) >= 2 and all(p.stat().st_size <= 4096 for p in parts)
    assert [p["sha256"] for p in manifest["parts"]] == [gpu_pack.sha256(p) for p in parts]
    assert (carried / "early.tar").exists() and manifest["versions"] == {"nvidia-dali-cuda130": "fake"}
    shipped = manifest["wheels"]["gpu_session_fake-0.1-py3-none-any.whl"]
    assert shipped["version"] == "0.1" and shipped["sha256"] != shipped["index_sha256"]  # rewritten uncompressed
    # a part is as large as a call carries beside this checkout's working tree
    tree = gpu_pack.tree_bytes(ROOT)
    assert 0 < tree < 32 * gpu_pack.MiB
    assert gpu_pack.part_bytes_for(ROOT, 0) == gpu_pack.CALL_LIMIT - tree - 64 * 1024 - gpu_pack.MARGIN
    with pytest.raises(ValueError, match="the working tree leaves .* commit or ignore less"):
        gpu_pack.part_bytes_for(ROOT, 0, limit=tree)


def test_the_pins_are_pinned_and_grouped(tmp_path):
    groups = gpu_pack.read_pins()
    assert set(groups) == {"early", "dali", "tests", "detection"} and "google-crc32c==1.9.0" in groups["early"]
    assert groups["detection"] == ["pycocotools==2.0.11"]  # CocoDetection's reader; torchvision is in the image
    assert any(p.startswith("nvidia-dali-cuda130==") for p in groups["dali"])
    assert any(p.startswith("nvidia-nvimgcodec-cu13==") for p in groups["dali"])
    (bad := tmp_path / "wheels.txt").write_text("[dali]\nnvidia-dali-cuda130>=2.4\n")
    with pytest.raises(ValueError, match=r"wheels.txt:2: expected .*pinned"):
        gpu_pack.read_pins(bad)


def test_a_corrupted_part_is_refused_and_named(tmp_path):
    carried, manifest = fake_parts(tmp_path)
    paths = gpu_session.Paths(tmp_path / "work")
    (carried / "part-00").write_bytes(b"not the part")
    with pytest.raises(ValueError, match="part-00: sha256 differs from manifest.json's; pack again"):
        gpu_session.receive(0, carried, paths, dry_run=True)
    assert not paths.data_done.parent.joinpath("data.log").exists()  # refused before the data generation starts
    with pytest.raises(FileNotFoundError, match="missing part-00, part-01, .*stay warm"):
        gpu_session.reassemble(paths)


def test_the_dry_run_end_to_end(tmp_path):
    """receive every part (call 1 starts the data generation detached), then run: the files written are at
    most 8, every step has its line, a step given 1 s is cut and says so, and the steps after it still run."""
    from torchvision_side import torchvision_available
    has_torchvision = torchvision_available()  # the detection steps' (installed into the side folder they read)
    carried, manifest = fake_parts(tmp_path)
    device_run = [sys.executable, str(ROOT / "scripts" / "gpu" / "device_run.py")]
    work, out = tmp_path / "work", tmp_path / "out"
    common = ["--carried", str(carried), "--work", str(work), "--dry-run"]
    for n in range(len(manifest["parts"])):
        subprocess.run([*device_run, "receive", str(n), *common], check=True, cwd=tmp_path, timeout=60)
    # detection-training's dry step is one SSDlite step on CPU: seconds, more on a loaded machine
    ran = subprocess.run([*device_run, "run", *common, "--out", str(out), "--budget", "ceiling=1", "--budget",
                          "doctor=1", "--budget", "detection-training=90"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert ran.returncode == 0, ran.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(gpu_session.OUT_FILES)
    lines = {line["step"]: line for line in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    steps = gpu_session.steps(gpu_session.Paths(work))
    names, first = [s.name for s in steps], next(i for i, s in enumerate(steps) if s.data)
    assert list(lines) == ["install", *names[:first], "data", *names[first:]]  # awaited where first needed
    assert lines["install"]["status"] == "ok" and lines["install"]["versions"] == {"nvidia-dali-cuda130": "fake"}
    assert (work / "site" / "gpu_session_fake" / "__init__.py").exists()  # the wheel, shipped uncompressed
    assert lines["data"]["status"] == "ok"
    for name in ("ceiling", "doctor"):  # a python that imports torch and DALI: never done within 1 s
        assert lines[name]["status"] == "cut" and lines[name]["reason"] == "cut: ran out of its 1 s budget"
    for name in ("gpu-features", "gpu-tests", "throughput", "epochs", "training", "startup", "memory"):
        assert lines[name] == {**lines[name], "status": "skipped", "reason": "skipped: no GPU"}
    assert lines["agreement"]["status"] == "ok" and lines["stress"]["status"] == "ok"
    assert {r["graph"]: r["mismatched"] for r in lines["agreement"]["result"]} == {"val": 0, "roi": 0}
    assert lines["stress"]["result"]["corrupt"] == 0 and lines["stress"]["result"]["images"] == 2 * 3 * 8
    assert "gpu-features.xml: missing" in lines["features"]["result"]["error"]
    # the new measurements' machinery on CPU: cold reads (the page cache dropped one way or the other, and which
    # way said), hw_decoder_load="auto", the baseline on a subset (the decode-only graph: the test below)
    cold = lines["throughput-cold"]["result"]
    assert lines["throughput-cold"]["status"] == "ok" and cold["page_cache"]["cold"] is True  # after the cut step
    assert cold["page_cache"]["how"] in ("drop_caches", "posix_fadvise") and cold["page_cache"]["drops"] >= 2
    assert [r["case"] for r in cold["rows"]] == ["DALI cpu hw_decoder_load=auto",
                                                 "DataLoader + PIL, 1 workers, 4 of 8 files"]
    assert all(r["images_per_s"] > 0 for r in cold["rows"])
    env = json.loads((out / "env.json").read_text())
    assert env["dry_run"] is True and "torch" in env and "nvidia-nvimgcodec-cu13" in env
    assert "dali_pipes sample" in (out / "commands.sh").read_text()
    assert "--detection" in (out / "commands.sh").read_text()
    assert "===== ceiling (budget 1 s)" in (out / "session.log").read_text()
    assert (work / "detection" / "annotations" / "instances_train.json").is_file()  # made by call 1's data job
    if has_torchvision:  # the detection steps on CPU: every preset's cases, every feed's data wait
        detection, training = lines["detection"], lines["detection-training"]
        assert detection["status"] == "ok" and training["status"] == "ok", (out / "session.log").read_text()[-3000:]
        assert [r["preset"] for r in detection["result"]["rows"]] == ["hflip", "ssdlite"]
        assert [r["case"] for r in detection["result"]["rows"][0]["rows"]] == ["DaliLoader",
                                                                             "DataLoader + PIL, 1 workers"]
        assert [r["feed"] for r in training["result"]["rows"]] == ["DaliLoader"]
        assert all(0 <= r["data_wait_fraction"] < 1 and r["images_per_s"] > 0 for r in training["result"]["rows"])


def test_the_plan_fits_the_deadline_with_detection_after_throughput(tmp_path):
    """The budgets add up to the run's deadline; issue 35's detection steps come right after the classification
    throughput, on the GPU at the references' batch sizes (Faster R-CNN's 2, SSDlite's 24)."""
    steps = gpu_session.steps(gpu_session.Paths(tmp_path))
    assert sum(s.budget_s for s in steps) == gpu_session.DEADLINE_S
    names = [s.name for s in steps]
    assert names[names.index("throughput") + 1:][:2] == ["detection", "detection-training"]
    detection = steps[names.index("detection")].argv
    assert detection[detection.index("--device") + 1] == "gpu"
    assert detection[detection.index("--batch-size") + 1:][:2] == ("2", "ssdlite=24")


def test_the_agreement_check_counts_a_mutated_graph(tmp_path):
    """The CPU graph against itself agrees on every hard kind; a graph that brightens by 4 levels, or that
    flips, is counted as mismatched in every image: the check can fail."""
    from nvidia.dali import fn
    gpu_agreement.make_hard_images(str(tmp_path), len(gpu_agreement.KINDS), workers=1)
    files = gpu_agreement.hard_files(str(tmp_path))
    assert {Path(f).parent.name for f in files} == set(gpu_agreement.KINDS)
    brighter = lambda *args: gpu_agreement.val_graph(*args) + 4
    flipped = lambda *args: fn.flip(gpu_agreement.roi_graph(*args), horizontal=1)
    rows = gpu_agreement.agreement(files, (0.0,), device="cpu", candidate={"val": brighter, "roi": flipped},
                                   image_size=32, batch=8)
    assert {r["graph"]: r["mismatched"] for r in rows} == {"val": len(files), "roi": len(files)}, rows
    same = gpu_agreement.agreement(files, (0.0,), device="cpu", image_size=32, batch=8)
    assert all(r["mismatched"] == 0 and r["worst_levels"] == 0 for r in same)


def test_the_hard_kinds_are_what_they_say(tmp_path):
    """Each kind's bytes are the format, chroma subsampling, mode or orientation it is named for."""
    from PIL import Image, JpegImagePlugin
    pixels = np.random.default_rng(0).integers(0, 255, (40, 56, 3), np.uint8)
    opened = {k: Image.open(io.BytesIO(gpu_agreement.encode(pixels, k))) for k in gpu_agreement.KINDS}
    assert [JpegImagePlugin.get_sampling(opened[k]) for k in ("444", "422", "420")] == [0, 1, 2]
    assert opened["progressive"].info.get("progressive") and opened["png"].format == "PNG"
    assert opened["cmyk"].mode == "CMYK" and opened["grey"].mode == "L"
    assert opened["exif_rotated"].getexif()[0x0112] == 6
    with pytest.raises(ValueError, match="unknown image kind 'gif'"):
        gpu_agreement.encode(pixels, "gif")


def test_the_stress_compares_every_output(tmp_path):
    gpu_agreement.make_hard_images(str(tmp_path), 8, workers=1)
    result = gpu_agreement.stress(gpu_agreement.hard_files(str(tmp_path)), iterations=3, device="cpu",
                                  image_size=32, batch=4)
    assert result["corrupt"] == 0 and result["images"] == 2 * 3 * 4 and not result["errors"]


def test_features_are_read_from_the_gpu_features_junit(tmp_path):
    """Each feature's gpu variant in tests/test_gpu_features.py, as pytest's junit file reports it: passed,
    failed, skipped, or not run; the cpu variants and other files' tests never count."""
    case = '<testcase classname="tests.test_gpu_features" name="{}" time="1.5">{}</testcase>'
    (junit := tmp_path / "j.xml").write_text("<testsuites><testsuite>" + "".join([
        case.format("test_val_cache_in_device_memory[gpu]", "<system-out>log</system-out>"),
        case.format("test_hybrid_decode_gives_the_cpu_graphs_batches[gpu]", '<failure message="differs"/>'),
        case.format("test_augmix_on_the_device[gpu]", '<skipped message="no pyarrow"/>'),
        case.format("test_mid_epoch_resume[cpu]", ""),
        '<testcase classname="tests.test_loader" name="test_mid_epoch_resume[gpu]"/>']) +
        "</testsuite></testsuites>")
    report = gpu_session.features(junit)
    assert set(report) == set(gpu_session.FEATURES)
    assert report["val cache in device memory"] == {
        "test": "tests/test_gpu_features.py::test_val_cache_in_device_memory[gpu]", "status": "passed", "seconds": 1.5}
    assert report["hybrid decode"]["status"] == "failed" and report["hybrid decode"]["message"] == "differs"
    assert report["augmix"]["status"] == "skipped" and report["mid-epoch resume"]["status"] == "not run"


def test_every_feature_has_its_test_on_both_devices():
    """The features step's table names tests that exist, each parametrized over cpu and gpu (-m gpu)."""
    import test_gpu_features
    for test in gpu_session.FEATURES.values():
        marks = getattr(test_gpu_features, test).pytestmark
        (devices,) = [m.args[1] for m in marks if m.name == "parametrize" and m.args[0] == "device"]
        assert devices[0] == "cpu" and devices[1].values == ("gpu",)
        assert [m.name for m in devices[1].marks] == ["gpu"]


class Parsed(Exception):
    """Raised by a patched ArgumentParser.parse_args once a command's flags have parsed."""


def test_every_steps_flags_parse(tmp_path, monkeypatch):
    """The GPU steps run only on a lent GPU: their flags are parsed here by each module's own parser, so that
    a renamed or removed flag fails CI, not the device run."""
    import argparse
    import importlib
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    checked = []
    for step in gpu_session.steps(gpu_session.Paths(tmp_path)):
        for argv in filter(None, (step.argv, step.dry)):
            module, args = argv[2], list(argv[3:])
            if module == "pytest":
                continue
            with pytest.raises(Parsed):
                importlib.import_module(module).main(args)
            checked.append(module)
    assert {"dali_pipes_bench.doctor_throughput", "dali_pipes_bench.epochs", "dali_pipes_bench.training",
            "dali_pipes_bench.startup", "dali_pipes.tools.doctor", "dali_pipes_bench.gpu_agreement",
            "dali_pipes_bench.gpu_session", "dali_pipes_bench.detection",
            "dali_pipes_bench.detection_training"} <= set(checked)


def test_the_measurements_flags_are_checked(tmp_path, capsys):
    """--loads takes numbers in [0, 1] and auto (not for the decode-only graph, which has no tuner); --feeds
    keeps the named feeds and the ideal, and names the feeds there are when one is unknown; cold runs name the
    data's file system."""
    import argparse

    from dali_pipes_bench import doctor_throughput, training
    assert doctor_throughput.parse_loads("1.0, 0.65,auto") == (1.0, 0.65, "auto")
    for bad, match in (("1.5", "1.5 is outside"), ("fast", "'fast' is neither")):
        with pytest.raises(argparse.ArgumentTypeError, match=match):
            doctor_throughput.parse_loads(bad)
    with pytest.raises(SystemExit):
        doctor_throughput.main([str(tmp_path), "--decode-only", "--loads", "auto", "--out", str(tmp_path)])
    assert "the decode-only graph has no tuner" in capsys.readouterr().err
    feeds = {"ideal (replayed)": 0, "DALI gpu": 1, "DALI cpu": 2, "DataLoader+PIL 16 workers": 3}
    assert list(training.chosen_feeds(feeds, "DALI gpu")) == ["ideal (replayed)", "DALI gpu"]
    assert training.chosen_feeds(feeds, "") == feeds
    with pytest.raises(ValueError, match="--feeds: no feed named 'tf.data' here; the feeds: 'ideal"):
        training.chosen_feeds(feeds, "DALI gpu,tf.data")
    assert isinstance(doctor_throughput.file_system(str(tmp_path)), str)


def test_the_training_step_reports_what_the_tuner_did(tmp_path, monkeypatch):
    """The training step's DALI feed from an empty tuning memory: its row carries the tuner's view (trials,
    choice, decision) and the seconds of each rebuild and trial, added up in rebuild_s."""
    from dali_pipes import DaliLoader
    from dali_pipes_bench import training

    from conftest import write_numbered
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "empty"))
    loader = DaliLoader(write_numbered(str(tmp_path), 240), batch_size=2, image_size=16, device="cpu", train=True,
                        seed=3, shuffle_buffer=16, num_threads="auto", hw_decoder_load="auto")
    for _ in loader:
        pass
    report = training.tuner_report(loader)
    assert report["tuned"]["done"] and len(report["tuned"]["trials"]) >= 2 and not report["tuned"]["remembered"]
    rebuilds = [e["seconds"] for e in report["tuner_events"] if e["event"] == "rebuild"]
    assert rebuilds and report["rebuild_s"] == round(sum(rebuilds), 3) > 0
    assert {e["event"] for e in report["tuner_events"]} == {"rebuild", "tuning trial"}
    assert training.tuner_report(iter([])) == {}  # the ideal and other feeds: nothing


def test_the_memory_step_runs_train_and_val_for_its_epochs(tmp_path):
    """The memory step's loop (startup.run_epochs), on CPU: after the first batches, the rest of the train epoch,
    then per epoch a whole val epoch and (but after the last) a whole train epoch."""
    from dali_pipes import DaliLoader
    from dali_pipes_bench import startup

    from conftest import write_numbered
    (tmp_path / "val").mkdir()
    data, val = write_numbered(str(tmp_path), 12), write_numbered(str(tmp_path / "val"), 6)
    train = DaliLoader(data, batch_size=4, train=True, device="cpu", image_size=16)
    it = iter(train)
    next(it)
    first = startup.run_epochs(train, it, 3, val, 4, None)
    assert first is not None and first > 0
    assert train.next_batch == (3, 0)  # epochs 0, 1 and 2 read whole: the next batch is epoch 3's first


def test_the_ceiling_times_the_decode_only_graph(tmp_path):
    """The ceiling step's command on CPU (its dry form): the decode-only graph at each load named, no baseline."""
    from dali_pipes_bench import doctor_throughput

    from conftest import write_numbered
    data = write_numbered(str(tmp_path), 8)
    doctor_throughput.main([data, "--decode-only", "--loads", "1.0,0", "--baseline-workers", "0", "--device", "cpu",
                            "--batch-size", "4", "--rounds", "1", "--min-seconds", "0.2", "--min-epochs", "0",
                            "--out", str(tmp_path / "out")])
    result = json.loads((tmp_path / "out" / "throughput.json").read_text())
    assert [r["case"] for r in result["rows"]] == ["decode-only cpu hw_decoder_load=1.0",
                                                   "decode-only cpu hw_decoder_load=0.0"]
    assert all(r["images_per_s"] > 0 for r in result["rows"]) and result["page_cache"] == {"cold": False}
