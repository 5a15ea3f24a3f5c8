"""The benchmark scripts run end to end with --quick (a smoke test: no timing is asserted), and
the comparison-only loaders deliver the right samples."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from dali_pipes import open_source
from dali_pipes_bench.harness import PreloadedDaliLoader

from conftest import write_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def raw_json_lines(stdout: str) -> list[str]:
    """Lines of a benchmark's stdout that are JSON: it prints tables and keeps its JSON in its results file."""
    return [line for line in stdout.splitlines() if line.lstrip().startswith(("{", "["))]


def assert_table(stdout: str, headers: list[str]) -> None:
    """stdout holds a markdown table under exactly these column headers: the header row, then its `|---|` row."""
    lines = stdout.splitlines()
    header = "| " + " | ".join(headers) + " |"
    assert header in lines, stdout[-3000:]
    assert re.fullmatch(r"\|(\s*-+\s*\|)+", lines[lines.index(header) + 1]), stdout[-3000:]


def results_path(stdout: str, cache) -> str:
    """The file or folder a benchmark's last line names (`results in PATH`), checked to lie under `cache`."""
    *_, last = stdout.strip().splitlines()
    assert last.startswith("results in "), stdout[-2000:]
    path = last[len("results in "):]
    assert os.path.commonpath([path, str(cache)]) == str(cache), (path, cache)
    return path


def _bench(tmp_path, script, *args):
    """`scripts/SCRIPT --quick` on 72 tiny images; tiny sizes on top of --quick (explicit flags win), so that a
    smoke test of every case spends its time on the cases, not on pixels."""
    data = tmp_path / "images"
    write_folder(str(data), counts=(24, 24, 24))
    run = subprocess.run([sys.executable, f"scripts/{script}", "--data", str(data), "--quick", "--out",
                          str(tmp_path / "out"), "--image-size", "32", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    [folder] = os.listdir(tmp_path / "out")
    return tmp_path / "out" / folder


def test_bench_loaders_quick(tmp_path):
    out = _bench(tmp_path, "bench_loaders.py", "--work", str(tmp_path / "work"))
    results = json.load(open(out / "results.json"))
    assert results["dataset"]["count"] == 72 and results["machine"]["cpu_count"] == os.cpu_count()
    groups = {r["group"] for r in results["results"]}
    assert {"loaders", "formats", "dali_threads", "torch_workers", "batch_size"} <= groups
    assert all(r["error"] is None and len(r["images_per_s"]) == 5 and r["median"] > 0 for r in results["results"])
    assert (out / "throughput.png").stat().st_size > 0 and (out / "scaling.png").stat().st_size > 0
    assert "| DALI cpu | train |" in (out / "results.md").read_text()


def test_bench_training_quick(tmp_path):
    out = _bench(tmp_path, "bench_training.py", "--batch-size", "8", "--steps", "2", "--warmup", "1")
    rows = json.load(open(out / "training.json"))["results"]
    assert rows[0]["real_over_ideal"] == 1.0 and all("error" not in r for r in rows)
    assert {r["feed"] for r in rows} >= {"DALI cpu", f"DataLoader+PIL {os.cpu_count()} workers"}


def test_preloaded_loader_delivers_each_sample_once(jpeg_folder):
    source = open_source(jpeg_folder)
    loader = PreloadedDaliLoader(source, batch_size=4, train=False, device="cpu", image_size=16, num_threads=1)
    labels = [l for _, batch in zip(range(3), loader) for l in batch[1].tolist()]
    assert sorted(labels) == sorted(source.labels)  # 12 samples, 3 batches of 4
    loader.close()


def test_profile_measures_every_stage_recommends_and_seeds_auto(tmp_path, monkeypatch):
    """dali-pipes profile on CPU: every stage at 1, half and all cores, the binding stage, the flags,
    the results files, and the tuning memory that num_threads="auto" then starts from."""
    from dali_pipes import DaliLoader
    from dali_pipes.run.machine import default_threads
    data = tmp_path / "images"
    write_folder(str(data), counts=(24, 24, 24))
    env = {**os.environ, "DALI_PIPES_CACHE": str(tmp_path / "cache")}
    # 3 rounds, each window 2 batches; a spread of up to 1000% still ranked (a test machine is noisy)
    run = subprocess.run([sys.executable, "-m", "dali_pipes.tools.cli", "profile", str(data), "--rounds", "3",
                          "--batches", "2", "--min-seconds", "0", "--min-epochs", "0", "--max-spread", "10",
                          "--batch-size", "8", "--image-size", "32", "--device", "cpu", "--out", str(tmp_path / "out")],
                         cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.load(open(tmp_path / "out" / "profile.json"))
    cores = default_threads()
    levels = sorted({1, max(1, cores // 2), cores})
    assert [(r["stage"], r["threads"]) for r in result["rows"]] == [
        (stage, t) for t in levels for stage in ("read", "decode", "augment", "iterator")]
    assert all(r["images_per_s"] > 0 and r["cpu_cores"] >= 0 and r["min"] <= r["images_per_s"] <= r["max"] and
               [w["units"] for w in r["windows"]] == [2, 2, 2] for r in result["rows"])
    assert result["binding_stage"] is None or result["binding_stage"].split(" ")[0] in ("read", "decode", "augment")
    assert set(result["stage_images_per_s"]) == {"read", "decode", "augment", "iterator"}
    threads = result["recommended"]["num_threads"]
    assert threads in levels and f"--num-threads {threads}" in run.stdout and "binding: " in run.stdout
    assert "Not measured without a GPU pipeline" in (tmp_path / "out" / "profile.md").read_text()
    assert (tmp_path / "out" / "profile.png").stat().st_size > 0
    monkeypatch.setenv("DALI_PIPES_CACHE", env["DALI_PIPES_CACHE"])
    loader = DaliLoader(str(data), batch_size=8, train=True, device="cpu", image_size=32)
    tuned = loader.stats()["tuned"]
    assert tuned["remembered"] and tuned["start"]["num_threads"] == threads
    loader.close()


def test_profile_names_a_binding_stage_only_below_the_need():
    """Issue 28: "binding stage: read" while the reader alone ran at 17-38k images/s, faster than the whole
    graph (13-15k). A stage binds only if its own rate is below the need (the model's, or the whole path's
    within 10%); the earliest such stage; else no single stage binds, and the rest is per-batch host cost."""
    from dali_pipes.run.stats import Spread
    from dali_pipes_bench.profile import binding
    issue = {"read": Spread.of([17_000, 25_000, 38_000]), "decode": Spread.of([14_600, 14_800, 15_200]),
             "augment": Spread.of([14_300, 14_500, 14_900]), "iterator": Spread.of([13_000, 14_000, 15_000])}
    found = binding(issue, "iterator", 64, None)
    assert found.stage == "decode" and "alone it gives 14,800 [14,600, 15,200] images/s" in found.text
    assert binding(issue, "iterator", 64, need=14_700).stage == "augment"  # decode alone gives more than 14,700
    fast = binding(issue, "iterator", 64, need=10_000)
    assert fast.stage is None and fast.text.startswith("no stage binds: the whole path gives 14,000")
    # every stage alone well above the whole path: the loss is the iterator's per-batch host cost
    host = {"read": Spread.of([30_000] * 3), "decode": Spread.of([20_000] * 3), "augment": Spread.of([16_000] * 3),
            "iterator": Spread.of([12_800] * 3)}
    found = binding(host, "iterator", 64, None)
    assert found.stage is None and found.text.startswith("no single stage binds: each alone is faster")
    assert "1.00 ms per batch" in found.text  # 64 * (1/12,800 - 1/16,000) s
    assert binding(host, "iterator", 64, None, "not ranked: spread 30% between rounds (read)").text == \
        "not named: spread 30% between rounds (read)"


def test_resolution_bench_quick(tmp_path):
    """dali-pipes bench resolution --quick: the loader alternates its sizes epoch by epoch, and python -m
    train runs at one size and with a ramp to it; the results say which size each figure is of."""
    data = tmp_path / "images" / "train"
    write_folder(str(data), counts=(8, 8, 8))
    write_folder(str(tmp_path / "images" / "val"), counts=(2, 2, 2))
    run = subprocess.run([sys.executable, "-m", "dali_pipes_bench.resolution", "--data", str(data), "--quick",
                          "--no-compile", "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    [folder] = os.listdir(tmp_path / "out")
    results = json.load(open(tmp_path / "out" / folder / "resolution.json"))
    assert [r["image_size"] for r in results["loader"]["epochs"]] == [32, 48]
    assert [(r["image_size"], r["epochs"]) for r in results["loader"]["per_size"]] == [(32, 1), (48, 1)]
    assert all(r["images"] == 24 // 8 * 8 and r["images_per_s"] > 0 for r in results["loader"]["epochs"])
    fixed, ramp = results["training"]
    assert (fixed["run"], fixed["image_size"]) == ("fixed #1", "48")
    assert (ramp["run"], ramp["image_size"]) == ("ramp #1", "0:32,1:48")
    assert [e["image_size"] for e in ramp["epochs"]] == [32, 48]
    assert [e["image_size"] for e in fixed["epochs"]] == [48, 48]
    assert all(r["final_val_top1"] is not None and len(r["epochs"]) == 2 for r in (fixed, ramp))
    assert "| 48 | 1 |" in (tmp_path / "out" / folder / "resolution.md").read_text()


def test_val_cache_bench_quick(jpeg_folder, tmp_path):
    """dali-pipes bench val-cache --quick: both sides time the same val epochs; the cached side gave its later
    epochs from the cache (a smoke test: no timing is asserted)."""
    run = subprocess.run([sys.executable, "-m", "dali_pipes_bench.val_cache", "--data", jpeg_folder, "--quick",
                          "--batch-size", "4", "--image-size", "32", "--num-threads", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "DALI_PIPES_CACHE": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stderr[-3000:]
    assert not raw_json_lines(run.stdout), run.stdout
    row = json.load(open(results_path(run.stdout, tmp_path / "cache" / "bench")))["row"]
    assert row["images_per_epoch"] == 12 and all(len(s) == 3 for s in row["epoch_s"].values())
    assert row["val_cache"]["state"] == "filled" and row["val_cache"]["epochs_replayed"] == 3
    assert "| from the val cache |" in run.stdout and "s per val epoch" in run.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_startup_bench_says_in_one_line_that_it_needs_a_gpu(jpeg_folder):
    run = subprocess.run([sys.executable, "-m", "dali_pipes_bench.startup", "--data", jpeg_folder, "--quick"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1 and run.stderr.strip().splitlines()[-1].startswith(
        "error: the startup benchmark needs a CUDA GPU")


@pytest.mark.gpu
def test_startup_bench_measures_each_preallocation_on_a_gpu(tmp_path):
    """The before/after of the GPU decoders' preallocation (decoder_size_hint), each case in a fresh process:
    dali-pipes bench startup --quick on the built-in dataset. The figures are recorded, not asserted."""
    out = tmp_path / "startup.json"
    run = subprocess.run([sys.executable, "-m", "dali_pipes_bench.startup", "--quick", "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.load(open(out))["summary"]
    assert set(summary) == {"imagenet", "data", "lazy"}
    assert all(figures["first_batch_s"]["median"] > 0 and figures["gpu_dali_peak_mb"]["median"] is not None
               for figures in summary.values())
    print(run.stdout)  # the measurements, for the GPU session's report (pytest -s)


def test_recipe_cost_alternates_the_cases_and_summarises_them(jpeg_folder, tmp_path, monkeypatch, capsys):
    """Issue 36: bench recipes printed a JSON line per round and case; now a table, its JSON in a file of each
    run's own under the cache root (two runs on one day: two files), and where it went."""
    from dali_pipes_bench import recipe_cost
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    paths = []
    for _ in range(2):
        assert recipe_cost.main(["--data", jpeg_folder, "--rounds", "2", "--batches", "1", "--batch-size", "4",
                                 "--image-size", "16", "--threads", "1", "--warmup", "1", "--device", "cpu"]) == 0
        stdout = capsys.readouterr().out
        assert not raw_json_lines(stdout) and "| mixup+cutmix |" in stdout
        paths.append(results_path(stdout, tmp_path / "cache" / "bench"))
    assert paths[0] != paths[1] and all(os.path.isfile(p) for p in paths)
    result = json.load(open(paths[0]))
    assert set(result["rates"]) == set(recipe_cost.CASES) and all(len(r) == 2 for r in result["rates"].values())
    assert {"median", "min", "max", "spread", "cost_percent"} <= set(result["summary"]["mixup+cutmix"])
    assert result["mix_ms"] > 0 and result["command"].startswith("dali-pipes bench recipes")


def test_sampler_cost_bench_quick(tmp_path):
    """dali-pipes bench sampler: both cases, alternating rounds, the summary and the command in its JSON."""
    data = tmp_path / "images"
    write_folder(str(data), counts=(8, 8, 8))
    run = subprocess.run([sys.executable, "-m", "dali_pipes_bench.sampler_cost", "--data", str(data), "--batch-size",
                          "4", "--image-size", "16", "--threads", "1", "--rounds", "2", "--epochs", "1", "--settle",
                          "0"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "DALI_PIPES_CACHE": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stderr[-3000:]
    assert not raw_json_lines(run.stdout), run.stdout  # issue 36: a JSON line per round and case
    result = json.load(open(results_path(run.stdout, tmp_path / "cache" / "bench")))
    assert {name: s["images_per_s"]["n"] for name, s in result["summary"].items()} == \
        {"plain": 2, "WeightedRandomSampler": 2, "SubsetRandomSampler": 2}
    assert [len(ratios) for ratios in result["round_ratios"].values()] == [2, 2]
    assert result["batches_per_epoch"] == 6 and result["command"].startswith("dali-pipes bench sampler")
    assert "cost of WeightedRandomSampler" in run.stdout


def test_bench_epochs_alternates_whole_epochs_under_the_protocol_and_reads_cold(tmp_path):
    """dali-pipes bench epochs: DaliLoader and DALIGenericIterator on the same graph, windows of whole epochs
    back to back, alternated over 3 rounds, each window's images counted exactly; --cold drops the data
    files from the page cache before each window and epoch (here: that it runs; a test cannot see the cache)."""
    data = tmp_path / "images"
    write_folder(str(data), counts=(8, 8, 8))  # 24 images: 3 train batches of 8 an epoch
    run = subprocess.run([sys.executable, "-m", "dali_pipes.tools.cli", "bench", "epochs", "--data", str(data),
                          "--batch-size", "8", "--image-size", "32", "--threads", "1", "--step", "0", "--epochs", "6",
                          "--rounds", "3", "--min-seconds", "0", "--cold", "--out", str(tmp_path / "epochs.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (row,) = json.load(open(tmp_path / "epochs.json"))["rows"]
    assert row["protocol"]["cold"] and row["batches_per_epoch"] == 3
    assert [r["case"] for r in row["rows"]] == ["DaliLoader", "DALIGenericIterator"]
    for side in row["rows"]:  # 6 epochs over 3 rounds: windows of 2 epochs of 24 images
        assert [(w["units"], w["images"]) for w in side["windows"]] == [(2, 48)] * 3
        assert side["min"] <= side["images_per_s"] <= side["max"]
    assert_table(run.stdout, ["side", "images/s median [min, max]", "spread", "cores busy",
                              "images per CPU second median [min, max]", "loop thread CPU ms per epoch",
                              "page faults per epoch"])
    assert "DaliLoader / DALIGenericIterator:" in run.stdout and "(medians)" in run.stdout
    assert not raw_json_lines(run.stdout) and run.stdout.strip().endswith(f"results in {tmp_path / 'epochs.json'}")


def test_bench_auto_prints_a_table_per_part_and_keeps_its_json(tmp_path):
    """dali-pipes bench auto, the loader alone, one round: a table of every case's epochs, auto over the best fixed
    count and why nothing is ranked under it, the JSON in its file."""
    data = tmp_path / "images"
    write_folder(str(data), counts=(8, 8, 8))
    out = tmp_path / "auto.json"
    run = subprocess.run([sys.executable, "-m", "dali_pipes.tools.cli", "bench", "auto", "--data", str(data),
                          "--skip-training", "--threads", "1", "--rounds", "1", "--batch-size", "8", "--image-size",
                          "32", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    loader = json.load(open(out))["loader"]
    assert set(loader["runs"]) == {"auto", "1"} and loader["unranked"].startswith("not ranked: 1 rounds")
    assert_table(run.stdout, ["threads", "epoch 2 images/s median [min, max]", "spread", "epoch 1 images/s median",
                              "epoch 2 / best fixed"])
    assert "auto / best fixed (1 threads): " in run.stdout and "not ranked: 1 rounds" in run.stdout
    assert not raw_json_lines(run.stdout) and run.stdout.strip().endswith(f"results in {out}")


def test_bench_sharding_prints_a_table_and_keeps_its_json(tmp_path):
    """dali-pipes bench sharding on 1,000 samples, 2 gloo ranks: the check and one all_gather in a table."""
    out = tmp_path / "sharding.json"
    run = subprocess.run([sys.executable, "-m", "dali_pipes.tools.cli", "bench", "sharding", "--samples", "1000",
                          "--repeats", "2", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.load(open(out))
    assert result["bytes_per_rank"] == 125 and [len(r["check_s"]) for r in result["ranks"]] == [2, 2]
    assert_table(run.stdout, ["samples", "ranks", "bytes per rank", "check ms, slowest rank: median [min, max]",
                              "all_gather of the same bytes ms: median [min, max]", "repeats"])
    assert "| 1,000 | 2 | 125 | " in run.stdout
    assert not raw_json_lines(run.stdout) and run.stdout.strip().endswith(f"results in {out}")


def test_bench_loaders_tables_rank_nothing_whose_passes_spread_more_than_ten_percent():
    from dali_pipes_bench.harness import Measurement, markdown_table
    steady = Measurement("DALI cpu", "loaders", "train", {}, images_per_s=[100.0, 102.0, 101.0, 99.0, 100.0],
                         first_batch_s=1.0, cpu_cores=1.9, host_peak_mb=500.0)
    noisy = Measurement("DataLoader+PIL 2 workers", "loaders", "train", {}, images_per_s=[50.0, 80.0, 60.0, 55.0, 58.0],
                        first_batch_s=1.0, cpu_cores=1.9, host_peak_mb=500.0)
    table = markdown_table([steady.row(), noisy.row()], "DALI cpu")
    assert "| DALI cpu | train | 100 [99, 102] | 1.00x |" in table
    assert "| DataLoader+PIL 2 workers | train | 58 [50, 80] | not ranked: spread 52% between passes |" in table


@pytest.mark.parametrize("scheme", ["http", "hf"])
def test_s3_feed_reads_the_same_images_from_local_disk_and_through_the_cache(scheme, tmp_path, capsys):
    """s3_feed --scheme http|hf: the shards on its local server behind the proxy; both cases read every batch."""
    if scheme == "hf":
        pytest.importorskip("huggingface_hub", reason="hf:// needs huggingface_hub: "
                            "pip install '.[hf]' (from the dali_pipes checkout)")
    from dali_pipes_bench import s3_feed
    out = tmp_path / "feed.jsonl"
    s3_feed.main(["--scheme", scheme, "--cases", "local", "cache", "--ranks", "1", "--images", "64", "--shards",
                  "4", "--batch-size", "8", "--delay-ms", "0", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert not raw_json_lines(stdout) and "| cache |" in stdout, stdout  # issue 36: a JSON line per case
    assert stdout.strip().splitlines()[-1] == f"results in {out}"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    cases = {r["case"]: r for r in rows if "case" in r}
    assert all("error" not in r for r in cases.values()), cases
    assert [cases["local"]["images"], cases["cache"]["images"]] == [120, 120]  # 2 epochs of 8 batches, less the first
    [cache] = cases["cache"]["cache"]
    assert cache["downloads"] >= 4 and cases["cache"]["requests"]["GET"] >= 4  # every shard fetched through the proxy
    assert len(cases["local"]["cpu_s"]) == len(cases["cache"]["cpu_s"]) == 1  # one rank's CPU seconds
    assert {r["summary"] for r in rows if "summary" in r} == {"local", "cache"}
    assert {r["scheme"] for r in rows} == {scheme}


def run_with_terminal_stderr(command: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, str]:
    """`command` with stdout piped and stderr on a 120-column pseudo-terminal, as a user's shell gives it (so
    that tqdm, with disable=None, draws its bars): (the finished process, what it wrote to the terminal)."""
    import fcntl
    import pty
    import struct
    import termios
    import threading
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    chunks: list[bytes] = []

    def drain() -> None:  # a terminal's buffer is small: read it while the command runs
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        run = subprocess.run(command, stdout=subprocess.PIPE, stderr=terminal, text=True, **kwargs)
    finally:
        os.close(terminal)
        reader.join(timeout=60)
        os.close(master)
    return run, b"".join(chunks).decode(errors="replace")


def test_bench_loaders_prints_tables_keeps_json_in_the_results_and_shows_a_bar_per_case(tmp_path):
    """Issue 36: bench loaders printed a raw JSON line per case before its tables, showed no progress inside a
    case, and wrote its results relative to wherever it ran. Now stdout holds the tables and where the results
    went, the JSON is in results.json under the cache root, and each case draws its own bar on a terminal."""
    data = tmp_path / "images"
    write_folder(str(data), counts=(24, 24, 24))  # --quick's batch of 32
    cache, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "DALI_PIPES_CACHE": str(cache), "PYTHONPATH": ROOT}
    run, terminal = run_with_terminal_stderr(
        [sys.executable, "-m", "dali_pipes_bench.loaders", "--data", str(data), "--quick", "--only",
         "loader_overhead", "--no-plots", "--work", str(tmp_path / "work")], cwd=elsewhere, env=env, timeout=600)
    assert run.returncode == 0, terminal[-3000:]
    assert not [line for line in run.stdout.splitlines() if line.lstrip().startswith("{")], run.stdout
    assert "| DaliLoader / bare DALI cpu | train |" in run.stdout
    [folder] = os.listdir(cache / "bench")
    results = json.load(open(cache / "bench" / folder / "results.json"))
    assert [(r["name"], r["error"], len(r["images_per_s"])) for r in results["results"]] == [
        ("DaliLoader / bare DALI cpu", None, 5)]
    assert f"results in {cache / 'bench' / folder}" in run.stdout
    assert not os.listdir(elsewhere)  # nothing written relative to the working directory
    assert "DaliLoader / bare DALI cpu" in terminal and "6/6" in terminal  # the case's bar: its build, 5 passes


def test_profile_plots_its_stages_on_a_log_axis():
    """Issue 36: read (38,000 images/s) and decode (about 800) on one linear axis left the stages that matter as
    slivers; on a log axis each stage's bar is readable."""
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib: "
                        "pip install '.[bench]' (from the dali_pipes checkout)")
    from dali_pipes_bench.profile import stage_chart
    rates = {"read": 38_000.0, "decode": 800.0, "augment": 760.0, "iterator": 700.0}
    rows = [{"case": f"{stage}, 2 threads", "images_per_s": rate} for stage, rate in rates.items()]
    figure = stage_chart(rows, "images/s")
    [axes] = figure.axes
    assert axes.get_xscale() == "log"
    low, high = axes.get_xlim()
    assert low <= 700 and high >= 38_000


def test_profile_says_once_why_nothing_is_ranked(tmp_path):
    """Issue 36: with rounds too few (or too noisy) to rank, the profile said why three times (binding, ranking,
    recommended); now once, on stdout and in profile.md."""
    data = tmp_path / "images"
    write_folder(str(data), counts=(4, 4, 4))
    env = {**os.environ, "DALI_PIPES_CACHE": str(tmp_path / "cache")}
    run = subprocess.run([sys.executable, "-m", "dali_pipes_bench.profile", str(data), "--rounds", "1", "--batches",
                          "1", "--min-seconds", "0", "--min-epochs", "0", "--batch-size", "4", "--image-size", "16",
                          "--device", "cpu", "--out", str(tmp_path / "out")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    reason = "1 round (at least 3 are needed)"
    assert run.stdout.count(reason) == 1, run.stdout
    assert (tmp_path / "out" / "profile.md").read_text().count(reason) == 1
    assert "nothing recommended; the tuning memory is left as it was" in run.stdout


def installed_files() -> list[str]:
    """The files `pip install .` puts in site-packages, relative to it: each package pyproject.toml lists, its own
    modules (setuptools installs no unlisted subpackage) and its package data."""
    from setuptools.config.pyprojecttoml import read_configuration
    config = read_configuration(os.path.join(ROOT, "pyproject.toml"))["tool"]["setuptools"]
    files = []
    for package in config["packages"]:
        folder = package.replace(".", "/")
        files += [f"{folder}/{name}" for name in sorted(os.listdir(os.path.join(ROOT, folder))) if name.endswith(".py")]
        files += [f"{folder}/{name}" for name in config.get("package-data", {}).get(package, [])]
    return files


def test_the_benchmark_servers_are_not_installed():
    """Issue 36: pip install put the benchmark's servers (latency_proxy, store_servers: emulators, an HTTP file
    server, a Hub mirror) into site-packages. They live in dali_pipes_bench/servers/, which the package list leaves
    out; the tests and a checkout's benchmarks import them from there."""
    files = installed_files()
    assert "dali_pipes/loader.py" in files and "dali_pipes_bench/profile.py" in files  # the list is read right
    assert not [f for f in files if "servers" in f or os.path.basename(f) == "latency_proxy.py"], files
    serving = re.compile(r"^\s*(from|import) (http\.server|socketserver|moto)\b", re.M)
    assert not [f for f in files if f.endswith(".py") and serving.search(open(os.path.join(ROOT, f)).read())]
    from dali_pipes_bench.servers import latency_proxy, store_servers  # noqa: F401  a checkout has them


def test_the_s3_bench_installed_without_its_servers_says_to_run_it_from_a_checkout(tmp_path):
    """dali-pipes bench s3 from a pip install (no servers): one line that says to run it from a checkout."""
    site = tmp_path / "site-packages"
    for name in installed_files():
        os.makedirs(site / os.path.dirname(name), exist_ok=True)
        shutil.copy(os.path.join(ROOT, name), site / name)
    # an editable install's finder would find the checkout's dali_pipes_bench/servers/: drop it, as pip's copy has none
    # (setuptools puts the finder class itself in sys.meta_path: its own __module__ names it, not its type's)
    code = ("import runpy, sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in "
            "getattr(f, '__module__', '') + type(f).__module__]; "
            "runpy.run_module('dali_pipes_bench.s3_feed', run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", code, "--cases", "local", "--ranks", "1", "--images", "8", "--shards",
                          "1", "--batch-size", "8"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stderr.startswith("error: ") and "run it from a checkout" in run.stderr, run.stderr


def test_bench_detection_runs_each_preset_against_dataloader_workers_and_writes_its_json(torchvision, tmp_path):
    """dali-pipes bench detection at a tiny size: CocoDetection (v2) of the built-in detection set, each preset
    with DaliLoader and DataLoader + PIL at each num_workers, alternated rounds; the JSON has every case's rounds
    and the ratio to the best DataLoader (no timing is asserted). torchvision comes from the tests' side folder."""
    from dali_pipes.tools.sample_detection import DetectionSampleConfig, make_detection_sample
    make_detection_sample(str(tmp_path / "det"), DetectionSampleConfig(train_images=8, val_images=0, min_side=64,
                                                                       max_side=96), workers=1, progress=False)
    out = tmp_path / "detection.json"
    folder = os.path.dirname(os.path.dirname(torchvision.__file__))
    run = subprocess.run([sys.executable, "-m", "dali_pipes.tools.cli", "bench", "detection", "--data",
                          str(tmp_path / "det"), "--batch-size", "2", "--threads", "1", "--workers", "0", "1",
                          "--rounds", "3", "--min-seconds", "0", "--min-epochs", "0", "--torchvision-path", folder,
                          "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.load(open(out))
    assert result["command"].startswith("dali-pipes bench detection") and set(result["load_average"]) == {
        "before", "after"}
    assert [r["preset"] for r in result["rows"]] == ["hflip", "multiscale", "ssdlite"]
    for row in result["rows"]:
        assert [r["case"] for r in row["rows"]] == ["DaliLoader", "DataLoader + PIL, 0 workers",
                                                    "DataLoader + PIL, 1 workers"]
        assert all(r["rounds"] == 3 and r["min"] <= r["images_per_s"] <= r["max"] for r in row["rows"])
        assert all(w["images"] == 2 for r in row["rows"] for w in r["windows"])
        assert row["best_dataloader"].startswith("DataLoader") and row["ratio_to_best_dataloader"] > 0
        assert "ratio_per_cpu_s" in row  # None where the windows were too short for the CPU clock
    assert "DaliLoader / DataLoader + PIL" in run.stdout
    assert_table(run.stdout, ["case", "images/s median [min, max]", "spread", "cores busy",
                              "images per CPU second median [min, max]"])
    assert run.stdout.count("| DaliLoader | ") == 3 and "hflip (RandomHorizontalFlip" in run.stdout


def test_bench_detection_batch_size_per_preset_and_gpu_refused_without_cuda():
    """--batch-size 2 ssdlite=24: the references' Faster R-CNN and SSDlite recipes in one run; an unknown preset
    is named; --device gpu without CUDA ends in one line that says what to pass instead."""
    import argparse

    from dali_pipes_bench import detection
    items = [detection.batch_size_arg(t) for t in ("2", "ssdlite=24")]
    assert [detection.batch_size_of(items, p) for p in ("hflip", "multiscale", "ssdlite")] == [2, 2, 24]
    assert detection.batch_size_of([("ssdlite", 24)], "hflip") == 8
    with pytest.raises(argparse.ArgumentTypeError, match="'ssd=4': no preset named 'ssd'; the presets: hflip"):
        detection.batch_size_arg("ssd=4")
    with pytest.raises(argparse.ArgumentTypeError, match="'0': expected N or PRESET=N"):
        detection.batch_size_arg("0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--device gpu: torch .* sees no CUDA device here; .* --device cpu"):
            detection.main(["--device", "gpu", "--data", "nowhere"])


def test_default_results_go_under_the_cache_root_in_a_folder_of_each_runs_own(tmp_path, monkeypatch):
    """Issue 36: two runs of bench loaders on one day wrote into one <machine>-<date> folder, the second over the
    first; every benchmark's default results now lie under $DALI_PIPES_CACHE/bench, one folder per run."""
    from dali_pipes_bench import cli, harness
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    info = {"cpu_count": 2, "date": "2026-11-30"}
    first, second = (harness.results_dir(cli.results_root(""), info) for _ in range(2))
    assert first == str(tmp_path / "cache" / "bench" / "cpu2-2026-11-30") and second == first + "-2"
    files = [cli.results_file("", "recipes", "recipes.json") for _ in range(2)]
    assert len({os.path.dirname(f) for f in files}) == 2
    assert all(f.startswith(str(tmp_path / "cache" / "bench" / "recipes-")) for f in files)
    assert cli.results_file(str(tmp_path / "mine.json"), "recipes", "recipes.json") == str(tmp_path / "mine.json")


def _formats_layout(root) -> None:
    """What bench formats makes under --data, at a tiny size: ROOT/images/train and ROOT/images/val."""
    write_folder(str(root / "images" / "train"), counts=(8, 8, 8))
    write_folder(str(root / "images" / "val"), counts=(2, 2, 2))


def test_bench_formats_prints_a_table_and_keeps_its_json_under_the_cache(tmp_path, monkeypatch, capsys):
    """Issue 36: bench formats ended stdout with a raw {"command": ..., "results": [...]} line; now a table per
    format, the JSON in this run's file under the cache root, and where it went."""
    from dali_pipes_bench import formats
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    _formats_layout(tmp_path / "work")
    assert formats.main(["--data", str(tmp_path / "work"), "--shards", "2", "--batch-size", "8", "--image-size",
                         "32", "--num-threads", "1"]) == 0
    stdout = capsys.readouterr().out
    assert not raw_json_lines(stdout), stdout
    assert "| image folder | 24 |" in stdout and "| WebDataset | 24 |" in stdout
    result = json.load(open(results_path(stdout, tmp_path / "cache" / "bench")))
    assert [r["format"] for r in result["results"]] == ["image folder", "TFRecord", "WebDataset"]
    assert result["command"].startswith("dali-pipes bench formats")


def test_bench_formats_refuses_a_folder_it_did_not_make(tmp_path):
    """Issue 36: given a user's train folder as --data, bench formats wrote its 1,200 images and 329 MB of shards
    into it; it now names the folder, what it holds, and what to pass, and writes nothing."""
    from dali_pipes.errors import DatasetError
    from dali_pipes_bench import formats
    write_folder(str(tmp_path / "train"))
    before = sorted(os.listdir(tmp_path / "train"))
    with pytest.raises(DatasetError, match=re.escape(str(tmp_path / "train")) + ": holds cat, dog, fish, which bench "
                                           "formats did not make.* pass a new or empty folder"):
        formats.main(["--data", str(tmp_path / "train")])
    assert sorted(os.listdir(tmp_path / "train")) == before


def test_bench_parquet_prints_a_table_and_keeps_its_json_under_the_cache(tmp_path, monkeypatch, capsys):
    """Issue 36: bench parquet ended stdout with its raw JSON line (print_and_save, shared with formats)."""
    pytest.importorskip("pyarrow", reason="the Parquet copy needs pyarrow: pip install '.[parquet]'")
    from dali_pipes_bench import parquet_feed
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    _formats_layout(tmp_path / "work")
    assert parquet_feed.main(["--data", str(tmp_path / "work"), "--shards", "2", "--rows-per-group", "4",
                              "--batch-size", "8", "--rounds", "1", "--image-size", "32", "--num-threads", "1"]) == 0
    stdout = capsys.readouterr().out
    assert not raw_json_lines(stdout) and "| Parquet |" in stdout, stdout
    result = json.load(open(results_path(stdout, tmp_path / "cache" / "bench")))
    assert set(result["results"]) == {"TFRecord", "Parquet"} and result["samples"] == 24
