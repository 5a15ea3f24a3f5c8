"""`python -m dali_pipes.doctor` on this (CPU) machine: it runs what applies, says plainly what it
could not check, writes its report, and exits 0; its pieces fail loudly when something is wrong."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from dali_pipes.tools import doctor, environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the doctor's CPU-machine report")
def test_doctor_on_a_cpu_machine(tmp_path):
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "dali_pipes.doctor", "--quick", "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "no GPU: torch" in run.stdout and f"dali: {doctor.environment()['dali']}" in run.stdout
    report = json.load(open(out / "doctor.json"))
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert status["static GPU graph checks"] == "PASSED" and status["CPU epoch (train and val)"] == "PASSED"
    assert status[doctor.DALI_WHEEL] == "PASSED" and report["environment"]["dali_wheel"].startswith("nvidia-dali-cuda")
    markdown = (out / "doctor.md").read_text()
    for gpu_only in ("gpu tests", doctor.COSTS, "GPU vs CPU outputs", doctor.THROUGHPUT):
        assert status[gpu_only] == "NOT CHECKED"
        said = lambda text, name=gpu_only: [l for l in text.splitlines() if "NOT CHECKED" in l and name in l]
        assert len(said(run.stdout)) == 1 and f" {gpu_only}: no GPU" in said(run.stdout)[0], run.stdout  # once
        assert len(said(markdown)) == 1 and f"| {gpu_only} | no GPU" in said(markdown)[0], markdown
    graphs = next(c for c in report["checks"] if c["name"] == "static GPU graph checks")["data"]["graphs"]
    assert len(graphs) >= 19 and all(g["ok"] for g in graphs)
    # DALI's auto_aug calls its own deprecated aliases (fn.experimental.equalize, .filter): not the user's concern
    assert "DeprecationWarning" not in run.stdout + run.stderr, run.stderr[-3000:]
    assert "0 failed" in run.stdout and not (out / "throughput.png").exists()  # nothing to plot without a GPU


def test_a_failed_check_is_reported_and_sets_the_exit_code(tmp_path, capsys):
    def broken():
        raise AssertionError("val images differ")

    checks = [doctor.run_check("passes", lambda: ("fine", {})), doctor.run_check("breaks", broken),
              doctor.run_check("skipped", lambda: (_ for _ in ()).throw(doctor.NotChecked("no GPU: none here")))]
    assert [c.status for c in checks] == [doctor.PASSED, doctor.FAILED, doctor.NOT_CHECKED]
    paths = doctor.write_results(str(tmp_path), {"torch": "x"}, checks, ["--quick"])
    assert doctor.report(checks, paths) == 1
    printed = capsys.readouterr().out
    assert "FAILED breaks" in printed and printed.count("skipped: no GPU: none here") == 1  # as it ran, once
    assert "| FAILED | breaks | AssertionError: val images differ |" in (tmp_path / "doctor.md").read_text()


def test_a_gpu_torch_cannot_use_is_a_failure_not_a_skip():
    env = {"cuda_available": False, "gpus_seen_by_nvidia_smi": "NVIDIA H100 80GB HBM3", "torch": "2.13.0+cpu",
           "torch_cuda": None}
    with pytest.raises(AssertionError, match="nvidia-smi sees NVIDIA H100.*install a CUDA build of torch"):
        doctor.check_torch_sees_gpu(env)


@pytest.mark.parametrize("name, expected", [("NVIDIA H100 80GB HBM3", "probably yes"),
                                            ("NVIDIA A100-SXM4-80GB", "probably yes"),
                                            ("NVIDIA L4", "probably yes"),
                                            ("NVIDIA GeForce RTX 4090", "probably no"),
                                            ("Tesla V100-SXM2-16GB", "probably no")])
def test_hardware_jpeg_decoder_guess_by_model(monkeypatch, name, expected):
    monkeypatch.setattr(environment.Nvml, "open", classmethod(lambda cls: None))  # as without pynvml
    assert environment.hardware_jpeg_decoder(name).startswith(expected)


def test_throughput_results_are_tabled_and_the_benchmark_plots_them(tmp_path):
    from dali_pipes_bench.doctor_throughput import plot
    rows = [{"case": "DALI gpu hw_decoder_load=0.65", "images_per_s": 9000.0, "jpeg_util_mean": 41.0,
             "gpu_util_mean": 55.0}, {"case": "DataLoader + PIL, 16 workers", "images_per_s": 1500.0}]
    checks = [doctor.Check(doctor.THROUGHPUT, doctor.PASSED, "best ...", {"rows": rows})]
    paths = doctor.write_results(str(tmp_path), {"gpu": "NVIDIA H100 80GB HBM3"}, checks, [])
    assert "| DALI gpu hw_decoder_load=0.65 | 9000.0 | 41.0 | 55.0 |" in (tmp_path / "doctor.md").read_text()
    assert str(tmp_path / "throughput.png") not in paths  # the doctor draws nothing itself
    assert plot(str(tmp_path), rows) == str(tmp_path / "throughput.png")
    assert (tmp_path / "throughput.png").stat().st_size > 0
    assert str(tmp_path / "throughput.png") in doctor.write_results(str(tmp_path), {}, checks, [])


def test_doctor_has_no_plotting_or_benchmark_and_writes_under_the_cache_root(monkeypatch, tmp_path):
    source = open(doctor.__file__).read()
    assert "matplotlib" not in source and "NvmlSampler" not in source and "dali_pipes_bench." in source
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path))
    assert doctor.parse_args([]).out.startswith(str(tmp_path / "doctor"))


# -- DALI's wheel against torch's CUDA (graph/wheel.py) ------------------------------------------------------

CU12, CU13 = ("nvidia-dali-cuda120", "2.4.0"), ("nvidia-dali-cuda130", "2.4.0")


@pytest.mark.parametrize("torch_cuda, wheels, problem", [
    ("12.8", [CU12], None),
    ("13.0", [CU13], None),
    (None, [CU12], None),  # a CPU torch: DALI's CPU pipelines run with either wheel
    (None, [CU13], None),
    ("13.0", [CU12], r"nvidia-dali-cuda120 2.4.0 is DALI built for CUDA 12, beside torch built for CUDA 13.0: two "
                     r"CUDA runtimes .*pip uninstall -y nvidia-dali-cuda120, then: pip install nvidia-dali-cuda130$"),
    ("12.4", [CU13], r"built for CUDA 13, beside torch built for CUDA 12.4.*pip install nvidia-dali-cuda120"),
    ("13.0", [CU12, CU13], r"2 DALI wheels are installed \(nvidia-dali-cuda120 2.4.0, nvidia-dali-cuda130 2.4.0\): "
                           r"they share .*pip uninstall -y nvidia-dali-cuda120 nvidia-dali-cuda130, "
                           r"then.*nvidia-dali-cuda130"),
    ("12.1", [], r"no DALI wheel is installed; for torch built for CUDA 12.1: pip install nvidia-dali-cuda120"),
    (None, [], r"no DALI wheel is installed; for a CPU build of torch: pip install nvidia-dali-cuda120"),
    ("11.8", [CU12], r"built for CUDA 12, beside torch built for CUDA 11.8.*then: pip install nvidia-dali-cuda110$"),
])
def test_the_dali_wheel_must_fit_torchs_cuda_major(torch_cuda, wheels, problem):
    from dali_pipes.graph.wheel import wheel_problem
    found = wheel_problem(torch_cuda, wheels)
    if problem is None:
        assert found is None and doctor.check_dali_wheel(torch_cuda, wheels)[1]["wheel"] == wheels[0][0]
    else:
        assert found is not None and re.search(problem, found), found
        with pytest.raises(AssertionError, match=problem):
            doctor.check_dali_wheel(torch_cuda, wheels)


def test_the_wheel_installed_here_is_found_and_fits():
    from dali_pipes.graph.wheel import installed_wheels, wheel_cuda_major
    wheels = installed_wheels()
    assert [name for name, _ in wheels] == ["nvidia-dali-cuda120"] and wheel_cuda_major("nvidia_dali_cuda130") == 13
    detail, _ = doctor.check_dali_wheel(torch.version.cuda, wheels)
    assert detail.startswith("nvidia-dali-cuda120 2.4.0 beside")
    with pytest.raises(ValueError, match="not a DALI wheel name"):
        wheel_cuda_major("nvidia-dali")


@pytest.mark.gpu
def test_the_doctor_reports_first_batch_and_gpu_memory_on_a_gpu(jpeg_folder):
    detail, data = doctor.check_costs(doctor.environment(), jpeg_folder, 4)
    assert data["first_batch_s"] > 0 and data["gpu_memory_unmeasured"] is None
    assert data["gpu_dali_peak_mb"] > 0 and data["gpu_torch_reserved_peak_mb"] is not None
    assert detail.startswith("first batch ") and "GPU memory: DALI" in detail
