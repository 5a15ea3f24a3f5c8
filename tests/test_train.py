"""The training loop end to end on CPU: 2-rank DDP (gloo) under torchrun learns with both
loaders, counts each val sample once, resumes a killed run on the same sample sequence, and
runs as two nodes with disjoint shards."""

import json
import os
import re
import shlex
import socket
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from dali_pipes.run.usage import GPU_MEMORY_KEYS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLOURS = [(220, 40, 40), (40, 200, 60), (50, 70, 230), (230, 220, 50)]


def _learnable(root, per_class, seed):
    """4 classes told apart by colour, with noise and a random dark square: learnable in a few epochs."""
    rng = np.random.default_rng(seed)
    for label, colour in enumerate(COLOURS):
        os.makedirs(root / f"c{label}", exist_ok=True)
        for i in range(per_class):
            pixels = np.clip(np.array(colour) + rng.normal(0, 25, (40, 40, 3)), 0, 255).astype(np.uint8)
            y, x = rng.integers(0, 28, 2)
            pixels[y:y + 12, x:x + 12] //= 3
            Image.fromarray(pixels).save(root / f"c{label}" / f"{i:03d}.jpg", quality=90)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    _learnable(root / "train", 24, 0)  # 96 train
    _learnable(root / "val", 9, 1)     # 36 val ...
    Image.fromarray(np.full((40, 40, 3), COLOURS[0], np.uint8)).save(root / "val" / "c0" / "extra.jpg")  # ... 37
    return root


def _numbered(root, n):
    """A file list of n flat images labelled with their index: labels identify samples."""
    root.mkdir()
    with open(root / "list.txt", "w") as f:
        for i in range(n):
            Image.fromarray(np.full((24, 24, 3), i * 5 % 256, np.uint8)).save(root / f"{i}.jpg")
            f.write(f"{i}.jpg {i}\n")
    return root / "list.txt"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(workdir, data, *extra, nproc=2, epochs=4, val=None):
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
            f"--master_port={_free_port()}", "-m", "train", "--data", str(data), "--device", "cpu",
            "--arch", "resnet10", "--width", "16", "--image-size", "32", "--batch-size", "8", "--epochs", str(epochs),
            "--warmup-epochs", "0.5", "--lr", "0.2", "--workdir", str(workdir), "--threads", "1", "--workers", "1",
            *(["--val-data", str(val)] if val else []), *map(str, extra)]


def torchrun(workdir, data, *extra, nproc=2, check=True, epochs=4, val=None, env=None):
    run = subprocess.run(torchrun_command(workdir, data, *extra, nproc=nproc, epochs=epochs, val=val), cwd=ROOT,
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    if check:
        assert run.returncode == 0, run.stderr[-3000:]
    return run


def crash_test(step, signal="KILL", rank=1, again_during_save=False, when="step"):
    """The environment of a crash test (train/crash_tests.py): SIG<signal> to rank `rank` after step `step`."""
    return {"DALI_PIPES_TEST_KILL_AT_STEP": str(step), "DALI_PIPES_TEST_KILL_RANK": str(rank),
            "DALI_PIPES_TEST_KILL_SIGNAL": signal, "DALI_PIPES_TEST_KILL_WHEN": when,
            "DALI_PIPES_TEST_KILL_AGAIN_DURING_SAVE": "1" if again_during_save else ""}


def metrics(workdir):
    return [json.loads(line) for line in open(workdir / "metrics.jsonl")]


def labels_by_step(workdir, rank):
    out = {}
    with open(workdir / f"labels-rank{rank}.jsonl") as f:
        for line in f:
            entry = json.loads(line)
            out[entry["step"]] = entry["labels"]
    return out


@pytest.mark.parametrize("loader", ["dali", "torch"])
def test_two_rank_ddp_learns_and_counts_val_once(tiny, tmp_path, loader):
    observed = ["--trace", tmp_path / "trace.json", "--tensorboard", tmp_path / "tb"]
    cached = ["--val-cache-bytes", "100000000"]  # val epochs 2-4 from the val cache (the torch loader has none)
    run = torchrun(tmp_path, tiny / "train", "--loader", loader, *observed, *cached, val=tiny / "val")
    history = metrics(tmp_path)
    check_observed(tmp_path, run.stdout, history)
    assert [h["epoch"] for h in history] == [0, 1, 2, 3]
    assert all(h["world_size"] == 2 and h["val_samples"] == 37 for h in history)  # odd: padding excluded
    assert history[-1]["val_top1"] >= 0.9, history[-1]
    assert all(h["steps"] == 96 // 2 // 8 for h in history)
    for key in ("images_per_s", "data_wait_fraction", "first_batch_s", "host_peak_mb", "train_loss"):
        assert history[-1][key] > 0
    for key in GPU_MEMORY_KEYS:  # there, and None on a machine without CUDA, with the reason
        assert all(key in h and h[key] is None for h in history), key
    assert all(h["gpu_memory_unmeasured"].startswith("no CUDA device") for h in history)
    assert os.path.exists(tmp_path / "checkpoint.pt") and not any(p.name.startswith("checkpoint.pt.") and
                                                                  p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_killed_run_resumes_on_the_same_sample_sequence(tiny, whole, tmp_path):
    """6 steps per epoch, checkpoints every 4 steps: killed after step 11 (epoch 1), the run
    resumes from step 8 (mid-epoch) and every step's labels, on both ranks, match an
    uninterrupted run (the preemption tests' one, without periodic checkpoints: a checkpoint
    must not change the sample sequence either)."""
    crashed = tmp_path / "crashed"
    common = ("--record-labels", "--checkpoint-every", "4")
    killed = torchrun(crashed, tiny / "train", *common, epochs=3, check=False, env=crash_test(11))
    assert killed.returncode != 0
    before = {r: labels_by_step(crashed, r) for r in (0, 1)}
    resumed = torchrun(crashed, tiny / "train", *common, "--resume", epochs=3)
    assert "resumed from" in resumed.stdout and "at step 8" in resumed.stdout
    for rank in (0, 1):
        after = labels_by_step(crashed, rank)  # the resumed run appended steps 9.. and rewrote them
        expected = labels_by_step(whole, rank)
        assert sorted(after) == list(range(1, 19)) == sorted(expected)
        assert after == expected
        assert all(before[rank][s] == expected[s] for s in range(1, 12) if s in before[rank])


PREEMPTION_ARGS = ("--record-labels", "--checkpoint-every", "0")


@pytest.fixture(scope="module")
def whole(tiny, tmp_path_factory):
    """The uninterrupted run the preemption and kill tests compare with: 3 epochs, labels recorded per step."""
    workdir = tmp_path_factory.mktemp("whole")
    torchrun(workdir, tiny / "train", *PREEMPTION_ARGS, epochs=3)
    return workdir


def test_sigterm_checkpoints_at_that_step_and_resume_goes_on_exactly(tiny, whole, tmp_path):
    """SIGTERM to one rank of a 2-rank torchrun job mid-epoch (step 9 of 6-step epochs, no periodic
    checkpoints): both ranks stop after step 9, it is checkpointed, the exit says "preempted" with a
    non-zero status, and --resume goes on with every step's labels of an uninterrupted run. The resumed
    epoch's metrics.jsonl line says it is partial, and how many of its steps ran before the resume."""
    stopped = tmp_path / "stopped"
    common = PREEMPTION_ARGS
    run = torchrun(stopped, tiny / "train", *common, epochs=3, check=False, env=crash_test(9, "TERM"))
    assert run.returncode != 0 and "preempted by SIGTERM at step 9 (epoch 1, batch 3)" in run.stdout
    resumed = torchrun(stopped, tiny / "train", *common, "--resume", epochs=3)
    assert "at step 9" in resumed.stdout
    for rank in (0, 1):
        assert labels_by_step(stopped, rank) == labels_by_step(whole, rank)
    # epoch 1's line says that its train_loss averages the 3 steps after the resume, not all 6
    assert [(m["epoch"], m["steps"], m["partial"], m.get("steps_before_resume")) for m in metrics(stopped)] == \
        [(0, 6, False, None), (1, 3, True, 3), (2, 6, False, None)]


def test_a_second_signal_during_the_checkpoint_write_leaves_it_whole(tiny, whole, tmp_path):
    """SIGTERM to rank 1 after step 9, then SIGTERM to rank 0 twice while it writes that step's checkpoint
    (as it opens the temporary file, and just before the rename), as from a scheduler that signals again or
    torchrun's agent forwarding one: the handler only notes a signal, so the save runs to its end. One
    checkpoint at step 9, no temporary file; --resume goes on with every step's labels of an uninterrupted run."""
    import torch
    stopped = tmp_path / "stopped"
    run = torchrun(stopped, tiny / "train", *PREEMPTION_ARGS, epochs=3, check=False,
                   env=crash_test(9, "TERM", again_during_save=True))
    assert run.returncode != 0 and "preempted by SIGTERM at step 9 (epoch 1, batch 3)" in run.stdout, run.stderr[-3000:]
    sent = [line for line in run.stderr.splitlines() if "crash test: SIGTERM sent during the checkpoint write" in line]
    assert [line.split("(")[1].split()[0] for line in sent] == ["open", "os.rename"]  # both inside the save
    assert sorted(p.name for p in stopped.iterdir() if "checkpoint" in p.name) == ["checkpoint.pt"]
    assert torch.load(stopped / "checkpoint.pt", map_location="cpu", weights_only=False)["step"] == 9
    resumed = torchrun(stopped, tiny / "train", *PREEMPTION_ARGS, "--resume", epochs=3)
    assert "at step 9" in resumed.stdout
    for rank in (0, 1):
        assert labels_by_step(stopped, rank) == labels_by_step(whole, rank)


def test_a_signal_that_arrives_while_a_rank_waits_in_the_vote_counts_at_the_next_vote(tiny, whole, tmp_path):
    """SIGTERM to rank 1 inside the stop vote after step 9, its own "no" already sent (the race that lost 2 of 8
    external SIGTERMs: the vote's result overwrote the noted signal, and the job trained on to the end). The
    noted signal is kept: the vote after step 10 carries it, both ranks stop after step 10 with a checkpoint,
    torchrun exits 1 (a rank's 143 is a failure to it), and --resume goes on with every step's labels of an
    uninterrupted run."""
    stopped = tmp_path / "stopped"
    run = torchrun(stopped, tiny / "train", *PREEMPTION_ARGS, epochs=3, check=False,
                   env=crash_test(9, "TERM", when="in-vote"))
    assert "crash test: SIGTERM sent in the stop vote (sent)" in run.stderr
    assert run.returncode == 1 and "preempted by SIGTERM at step 10 (epoch 1, batch 4)" in run.stdout, \
        run.stderr[-3000:]
    assert "exitcode  : 143" in run.stderr  # the ranks' status, in torchrun's ChildFailedError report
    resumed = torchrun(stopped, tiny / "train", *PREEMPTION_ARGS, "--resume", epochs=3)
    assert "at step 10" in resumed.stdout
    for rank in (0, 1):
        assert labels_by_step(stopped, rank) == labels_by_step(whole, rank)


def test_a_signal_to_one_rank_after_an_epochs_last_vote_stops_every_rank_at_that_epochs_end(tiny, tmp_path):
    """SIGTERM to rank 1 right after the vote of step 6, the last of epoch 0 (6-step epochs, with validation).
    Before, the decision after the epoch used each rank's own flag: rank 1 went into the checkpoint's gather,
    rank 0 into validation, and both waited out --dist-timeout with no checkpoint written. Now that decision is
    a vote too: both ranks stop after step 6, the checkpoint is written (epoch 0's validation pending in it)."""
    import torch
    stopped = tmp_path / "stopped"
    run = torchrun(stopped, tiny / "train", *PREEMPTION_ARGS, "--dist-timeout", 60, epochs=3, val=tiny / "val",
                   check=False, env=crash_test(6, "TERM", when="after-vote"))
    assert "crash test: SIGTERM sent in the stop vote (decided)" in run.stderr
    assert run.returncode == 1 and "preempted by SIGTERM at step 6 (epoch 1, batch 0)" in run.stdout, \
        run.stderr[-3000:]
    state = torch.load(stopped / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert state["step"] == 6 and state["pending_epoch"]["epoch"] == 0
    assert json.load(open(stopped / "preempted.json"))["pending_epoch"] == 0


@pytest.fixture(scope="module")
def whole_validated(tiny, tmp_path_factory):
    """The uninterrupted run with validation: 3 epochs of 6 steps."""
    workdir = tmp_path_factory.mktemp("whole_validated")
    torchrun(workdir, tiny / "train", *PREEMPTION_ARGS, epochs=3, val=tiny / "val")
    return workdir


def test_preempted_after_an_epochs_last_step_that_epoch_is_validated_on_resume(tiny, whole_validated, tmp_path):
    """SIGTERM to rank 1 after step 6, the last of epoch 0, before its validation. Before, the checkpoint was at
    epoch 1's start and epoch 0's validation and metrics.jsonl line were lost for good. Now the checkpoint
    records the pending validation, and --resume runs it first: metrics.jsonl has every epoch, each line
    (losses and accuracies included) that of an uninterrupted run."""
    stopped = tmp_path / "stopped"
    run = torchrun(stopped, tiny / "train", *PREEMPTION_ARGS, epochs=3, val=tiny / "val", check=False,
                   env=crash_test(6, "TERM"))
    assert run.returncode == 1 and "preempted by SIGTERM at step 6 (epoch 1, batch 0)" in run.stdout, \
        run.stderr[-3000:]
    assert not os.path.exists(stopped / "metrics.jsonl")
    torchrun(stopped, tiny / "train", *PREEMPTION_ARGS, "--resume", epochs=3, val=tiny / "val")
    assert [m["epoch"] for m in metrics(stopped)] == [0, 1, 2]
    same = ("epoch", "steps", "partial", "train_loss", "val_loss", "val_top1", "val_top5", "val_samples", "step", "lr")
    assert [[m[k] for k in same] for m in metrics(stopped)] == [[m[k] for k in same] for m in metrics(whole_validated)]
    assert "epoch 0's validation runs first on --resume" in run.stdout


def started_torchrun(workdir, data, *extra, **kwargs):
    return subprocess.Popen(torchrun_command(workdir, data, *extra, **kwargs), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def wait_for_step(workdir, step, job):
    """Return once rank 0 has recorded step `step` (--record-labels); fail if the job ends first."""
    import time
    path, deadline = workdir / "labels-rank0.jsonl", time.monotonic() + 600
    while not (path.exists() and any(json.loads(line)["step"] >= step for line in open(path).read().splitlines(True)
                                     if line.endswith("\n"))):
        assert job.poll() is None, job.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the job never reached that step"
        time.sleep(0.02)


def kill_leftover_ranks(workdir):
    """SIGKILL any process of this test still running `-m train` on `workdir` (ranks a failed test orphaned)."""
    import signal
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"train" in args and str(workdir).encode() in args:
            os.kill(int(pid), signal.SIGKILL)


def test_sigusr1_to_the_torchrun_launcher_alone_stops_the_ranks_with_a_checkpoint(tmp_path):
    """SIGUSR1 to the torchrun launcher only, as from a scheduler that signals just the process it started:
    torchrun does not handle USR1 and dies of it. Before, the orphaned ranks trained on and failed at an epoch's
    end naming the sharding check. Now each rank sees at its next vote that its launcher is gone and says so in
    one line naming the cause and the fix; every rank stops after the same step with a checkpoint and
    WORKDIR/preempted.json, and --resume trains each sample exactly once per epoch over both runs."""
    import signal

    import torch
    data = _numbered(tmp_path / "numbered", 96)
    work = tmp_path / "run"
    args = ("--record-labels", "--checkpoint-every", "0", "--width", "8", "--batch-size", "2")  # 24 steps an epoch
    job = started_torchrun(work, data, *args, epochs=4)  # 96 steps: far from done when the signal comes
    try:
        wait_for_step(work, 26, job)  # into epoch 1: the first epoch's end (its sharding check) is behind
        os.kill(job.pid, signal.SIGUSR1)
        out, err = job.communicate(timeout=300)  # its pipes close when the last rank exits
    finally:
        kill_leftover_ranks(work)
    assert job.returncode == -signal.SIGUSR1
    # each rank's line, after a progress bar; lines of two ranks may still share one line of the pipe
    lost = re.findall(r"(rank \d): the torchrun launcher \(pid \d+\) is gone", err)
    assert sorted(lost) == ["rank 0", "rank 1"], err[-3000:]
    assert err.count("--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1") == 2
    status = json.load(open(work / "preempted.json"))
    step = status["step"]
    assert status["launcher_lost"] and status["signal"] is None and status["exit_code"] == 1
    epoch, batch = divmod(step, 24)
    assert f"stopped (the torchrun launcher is gone) at step {step} (epoch {epoch}, batch {batch}): checkpoint" in out
    assert torch.load(work / "checkpoint.pt", map_location="cpu", weights_only=False)["step"] == step
    before = {r: labels_by_step(work, r) for r in (0, 1)}
    resumed = torchrun(work, data, *args, "--resume", epochs=4)
    assert f"at step {step}" in resumed.stdout and not os.path.exists(work / "preempted.json")
    after = {r: labels_by_step(work, r) for r in (0, 1)}  # steps after `step` rewritten by the resumed run
    for e in range(4):
        seen = [label for r in (0, 1) for s in range(24 * e + 1, 24 * e + 25)
                for label in (before if s <= step else after)[r][s]]
        assert sorted(seen) == list(range(96)), e


def test_a_preempted_job_tells_a_requeue_script_in_preempted_json(tiny, tmp_path):
    """What each level returns: SIGTERM to the torchrun launcher, which forwards it to the ranks; they stop
    after one step with a checkpoint and exit 143 (128 + SIGTERM), and torchrun exits 1 (its SignalException;
    a signal to a rank gives 1 too, its ChildFailedError). So rank 0 writes WORKDIR/preempted.json with the
    signal, the ranks' exit status, the step and the checkpoint; the next run in that workdir removes it,
    and a run that ends well leaves none."""
    import signal
    work = tmp_path / "run"
    args = ("--record-labels", "--checkpoint-every", "0", "--batch-size", "2")  # 24 steps an epoch
    job = started_torchrun(work, tiny / "train", *args, epochs=3)  # 72 steps: far from done when signalled
    try:
        wait_for_step(work, 3, job)
        os.kill(job.pid, signal.SIGTERM)
        out, err = job.communicate(timeout=300)
    finally:
        kill_leftover_ranks(work)
    assert job.returncode == 1 and "SignalException" in err
    status = json.load(open(work / "preempted.json"))
    step = status["step"]
    epoch, batch = divmod(step, 24)
    assert f"preempted by SIGTERM at step {step} (epoch {epoch}, batch {batch})" in out
    assert status == {"signal": "SIGTERM", "launcher_lost": False, "exit_code": 143, "step": step, "epoch": epoch,
                      "batch": batch, "checkpoint": str(work / "checkpoint.pt"),
                      "pending_epoch": None if batch else epoch - 1, "resume": "the same command with --resume"}
    resumed = torchrun(work, tiny / "train", *args, "--resume", epochs=3)
    assert f"at step {step}" in resumed.stdout and not os.path.exists(work / "preempted.json")


def test_resume_without_a_checkpoint_says_so(tiny, tmp_path):
    missing = torchrun(tmp_path / "typo", tiny / "train", "--resume", epochs=1, nproc=1, check=False)
    assert missing.returncode != 0 and "--resume: no checkpoint at" in missing.stderr
    fresh = torchrun(tmp_path / "fresh", tiny / "train", "--resume-if-present", epochs=1, nproc=1)
    assert fresh.returncode == 0 and "resumed from" not in fresh.stdout


def test_the_crash_tests_hooks_are_not_flags_of_the_users_command():
    """Issue 25: --kill-at-step, --kill-rank, --kill-signal and --kill-again-during-save were in `python -m train
    --help`. The crash tests now set DALI_PIPES_TEST_KILL_* (train/crash_tests.py); the command refuses the old
    flags like any unknown one."""
    help_text = subprocess.run([sys.executable, "-m", "train", "--help"], cwd=ROOT, capture_output=True, text=True,
                               timeout=300, check=True).stdout
    assert "--workdir" in help_text and "--resume" in help_text
    assert "kill" not in help_text.lower() and "crash" not in help_text.lower()
    from train.train import get_args_parser
    for flag in ("--kill-at-step", "--kill-rank", "--kill-signal", "--kill-again-during-save"):
        with pytest.raises(SystemExit):
            get_args_parser().parse_args([flag, "1"])


def test_a_crash_test_environment_is_read_whole_or_refused_in_one_line():
    from train import crash_tests
    assert crash_tests.step_hooks({}) == [] and crash_tests.step_hooks(crash_test(0)) == []
    (hook,) = crash_tests.step_hooks(crash_test(9, "TERM", rank=1, again_during_save=True, when="in-vote"))
    assert hook == crash_tests.KillAtStep(step=9, rank=1, signal_name="TERM", again_during_save=True, when="in-vote")
    for env, message in [({"DALI_PIPES_TEST_KILL_SIGNAL": "HUP"}, "SIGNAL=HUP: expected one of KILL, TERM, USR1"),
                         ({"DALI_PIPES_TEST_KILL_WHEN": "soon"}, "WHEN=soon: expected step, in-vote or after-vote"),
                         ({"DALI_PIPES_TEST_KILL_RANK": "one"}, "RANK=one: expected a whole number")]:
        with pytest.raises(SystemExit, match=re.escape(f"$DALI_PIPES_TEST_KILL_{message}")):
            crash_tests.step_hooks({**crash_test(9), **env})


def test_two_nodes_get_disjoint_shards(tmp_path):
    """Two torchrun agents as two nodes (--nnodes=2, c10d rendezvous on localhost, one rank
    each): both have LOCAL_RANK 0, but their global ranks 0 and 1 must read disjoint shards."""
    data = _numbered(tmp_path / "numbered", 40)
    port = _free_port()
    cmd = lambda: [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                   "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=two-nodes",
                   "-m", "train", "--data", str(data), "--device", "cpu", "--arch", "resnet10",
                   "--width", "8", "--image-size", "16", "--batch-size", "4", "--epochs", "1", "--threads", "1",
                   "--workdir", str(tmp_path / "run"), "--record-labels", "--checkpoint-every", "0"]
    nodes = [subprocess.Popen(cmd(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for node in nodes:
        _, err = node.communicate(timeout=300)
        assert node.returncode == 0, err[-3000:]
    seen = [{l for labels in labels_by_step(tmp_path / "run", r).values() for l in labels} for r in (0, 1)]
    assert len(seen[0]) == len(seen[1]) == 20 and not seen[0] & seen[1]  # 40 samples, 2 ranks, batch 4


def test_killing_one_rank_ends_the_job_and_resume_sees_each_sample_once(killed_two_rank_run, tmp_path):
    """torchrun, 2 CPU ranks, 48 numbered samples (6 steps an epoch per rank): SIGKILL rank 1 after
    step 9 (mid epoch 1), the job of killed_two_rank_run. The job ends on its own, quickly, naming the
    rank and the signal; no half-written checkpoint is left; --resume finishes the run, and over both
    runs each sample of the interrupted epoch was trained on exactly once."""
    import shutil
    data, killed_work, killed, seconds = killed_two_rank_run
    assert killed.returncode != 0 and seconds < 120
    assert "Signal 9 (SIGKILL)" in killed.stderr and "rank      : 1" in killed.stderr
    assert not [p for p in killed_work.iterdir() if ".tmp" in p.name]
    work = tmp_path / "run"
    shutil.copytree(killed_work, work)
    before = {r: labels_by_step(work, r) for r in (0, 1)}
    resumed = torchrun(work, data, *ELASTIC_ARGS, "--resume", epochs=2)
    assert "at step 8" in resumed.stdout
    epoch1 = []
    for rank in (0, 1):
        after = labels_by_step(work, rank)  # steps 9.. rewritten by the resumed run
        steps = {s: (after if s > 8 else before[rank])[s] for s in range(7, 13)}
        epoch1 += [l for s in sorted(steps) for l in steps[s]]
    assert sorted(epoch1) == list(range(48))


def test_lr_schedule_runs_by_samples_seen_across_a_new_global_batch():
    """Same global batch: the factor of the old per-step schedule. After `rebase` to another global
    batch, the factor is that of the samples seen, not of the step count."""
    import math

    from train.optim import WarmupCosine
    per_step = lambda step, total, warmup: (step + 1) / warmup if step < warmup else \
        0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))
    schedule = WarmupCosine(total_samples=100 * 16, warmup_samples=10 * 16, global_batch=16)
    assert all(abs(schedule(s) - per_step(s, 100, 10)) < 1e-12 for s in range(120))
    schedule.rebase(step=40, global_batch=48)  # 2 ranks of 8 -> 6 ranks of 8: a step is 3 old steps
    assert schedule.samples(50) == 40 * 16 + 10 * 48
    assert all(abs(schedule(40 + k) - per_step(40 + 3 * k, 100, 10)) < 1e-12 for k in range(25))


ELASTIC_ARGS = ("--record-labels", "--checkpoint-every", "2", "--width", "8", "--image-size", "16", "--batch-size", "4")


@pytest.fixture(scope="module")
def killed_two_rank_run(tmp_path_factory):
    """torchrun, 2 CPU ranks, 48 numbered samples, batch 4 (6 steps an epoch): rank 1 killed after
    step 9, mid epoch 1; the last checkpoint is step 8's. Returns (data, workdir, the killed job, its seconds):
    each test resumes a copy of the workdir."""
    import time
    root = tmp_path_factory.mktemp("killed")
    data = _numbered(root / "numbered", 48)
    start = time.monotonic()
    killed = torchrun(root / "run", data, *ELASTIC_ARGS, epochs=2, check=False, env=crash_test(9))
    seconds = time.monotonic() - start
    assert killed.returncode != 0 and "Signal 9 (SIGKILL)" in killed.stderr, killed.stderr[-3000:]
    return data, root / "run", killed, seconds


@pytest.mark.parametrize("new_world", [1, 3])
def test_killed_run_resumes_on_another_world_size_each_sample_at_most_once(killed_two_rank_run, tmp_path,
                                                                           new_world):
    """The killed 2-rank run resumes on `new_world` ranks. Over both runs each sample of epoch 1 is
    trained on at most once, the rest of the epoch loses less than one batch per new rank, and
    epoch 1 ends at the lr of the samples seen (the schedule runs by samples, not steps)."""
    import math
    import shutil
    data, killed, _, _ = killed_two_rank_run
    work = tmp_path / "run"
    shutil.copytree(killed, work)
    before = {r: labels_by_step(work, r) for r in (0, 1)}
    lines = {r: sum(1 for _ in open(work / f"labels-rank{r}.jsonl")) for r in (0, 1)}
    resumed = torchrun(work, data, *ELASTIC_ARGS, "--resume", epochs=2, nproc=new_world)
    assert "at step 8" in resumed.stdout
    epoch1 = [l for r in (0, 1) for s in (7, 8) for l in before[r][s]]  # steps 7-8: epoch 1 up to the checkpoint
    for rank in range(new_world):
        with open(work / f"labels-rank{rank}.jsonl") as f:
            entries = [json.loads(line) for line in f][lines.get(rank, 0):]  # written by the resumed run
        assert entries and all(e["step"] > 8 and e["epoch"] == 1 for e in entries)
        epoch1 += [l for e in entries for l in e["labels"]]
    assert len(epoch1) == len(set(epoch1)) and set(epoch1) <= set(range(48))
    assert len(epoch1) == 16 + (48 - 16) // new_world // 4 * 4 * new_world and 48 - len(epoch1) < new_world * 4
    (last,) = [m for m in metrics(work) if m["world_size"] == new_world]
    samples, total, warmup = 6 * 8 + len(epoch1), 2 * 6 * 8, 3 * 8  # epoch 0: 6 steps of 8; warm-up: 3 steps
    expected = 0.2 * 0.5 * (1 + math.cos(math.pi * (samples - warmup) / (total - warmup)))  # --lr 0.2
    assert abs(last["lr"] - expected) < 1e-9, (last, expected)


def check_observed(workdir, stdout, history):
    """Per-rank data-wait in metrics.jsonl, one verdict line per epoch, the trace, the TensorBoard scalars."""
    for h in history:
        assert [r["rank"] for r in h["ranks"]] == [0, 1]
        assert all(0 <= r["data_wait_fraction"] < 1 and r["steps_per_s"] > 0 for r in h["ranks"])
        assert h["verdict"].startswith(f"epoch {h['epoch']}, train loader: ") and ("input-bound" in h["verdict"])
        assert all(r["steady_batches"] + r["rebuilds"] <= h["steps"] for r in h["ranks"])
        assert h["verdict"] in stdout.splitlines()
    text = open(workdir / "trace.json").read()
    assert text.startswith("[")
    events = json.loads(text.rstrip().rstrip(",") + "]")
    steps = [e for e in events if e["name"] == "step"]
    assert {e["tid"] for e in steps} == {0, 1} and len(steps) == 2 * sum(h["steps"] for h in history)
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} == {"rank 0", "rank 1"}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    board = EventAccumulator(str(workdir / "tb"))
    board.Reload()
    assert len(board.Scalars("val_top1")) == len(history)
    assert len(board.Scalars("data_wait_fraction/rank1")) == len(history)


def test_a_full_disk_during_a_checkpoint_names_workdir_and_keeps_the_old_one(tmp_path, disk_full):
    import torch

    from dali_pipes.storage.files import DiskFullError
    from train.metrics import atomic_save
    path = str(tmp_path / "checkpoint.pt")
    atomic_save({"step": 1}, path)
    disk_full(tmp_path)
    with pytest.raises(DiskFullError, match=f"{path}: no space left on the device.*--workdir"):
        atomic_save({"step": 2}, path)
    disk_full(None)
    assert torch.load(path)["step"] == 1 and os.listdir(tmp_path) == ["checkpoint.pt"]


def test_a_second_live_job_on_a_workdir_is_refused_and_a_stale_lock_taken_over(tmp_path, capsys):
    import time

    from train import lock
    work = str(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom train.lock import hold\n"
                               f"hold({work!r}, 0)\nprint('held', flush=True)\ntime.sleep(600)"],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(lock.WorkdirBusy, match=f"{work} is in use by pid {holder.pid} on {socket.gethostname()}"):
            lock.hold(work, 0)
        assert lock.hold(work, 1) is None  # only rank 0 takes it
    finally:
        holder.kill()  # as SIGKILL leaves it: the lock stays, its pid dead on this host
        holder.wait()
    path = lock.hold(work, 0)
    assert f"taking over a stale lock of pid {holder.pid}" in capsys.readouterr().out
    assert lock.holder_of(path)["pid"] == os.getpid()
    lock.release(path)
    with open(path, "w") as f:  # another host's lock, not refreshed for long: that job is gone
        json.dump({"host": "elsewhere", "pid": 1, "started": "then"}, f)
    assert lock.WorkdirBusy and not lock.stale(lock.holder_of(path), path)  # fresh: that host may still run it
    os.utime(path, (time.time() - 2 * lock.STALE_S,) * 2)
    assert lock.hold(work, 0) == path and "pid 1 on elsewhere" in capsys.readouterr().out
    lock.release(path)
    assert not os.path.exists(path)


@pytest.fixture
def live_process():
    """Another process of this host that runs while the test does (a lock may name it)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield process
    process.kill()
    process.wait()


def _proc_identity(pid):
    """(boot id, start time in clock ticks) of `pid` as Linux's /proc gives them: what the lock records."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot, open(f"/proc/{pid}/stat") as stat:
            return boot.read().strip(), int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22
    except OSError:
        pytest.skip("no /proc boot id or process start time on this system")


def _write_lock(work, **holder):
    with open(os.path.join(work, "lock"), "w") as f:
        json.dump({"host": socket.gethostname(), "started": "then", **holder}, f)


def test_a_lock_whose_pid_now_names_another_process_is_taken_over(tmp_path, capsys, live_process):
    """Issue 24: after a container restart with the same hostname, the new job's own pid (or another live
    one) is the old lock's pid, and the job was refused forever. The lock now records the boot id and the
    pid's start time: a pid alive with another start, on another boot, or our own pid is a stale lock."""
    from train import lock
    work, pid = str(tmp_path), live_process.pid
    boot, started = _proc_identity(pid)
    stale_locks = [dict(pid=os.getpid()),  # an old-format lock naming our own pid: a previous job's
                   dict(pid=os.getpid(), boot_id=boot, pid_started=_proc_identity(os.getpid())[1] - 1),
                   dict(pid=pid, boot_id=boot, pid_started=started - 1),  # the pid now runs another process
                   dict(pid=pid, boot_id="another-boot", pid_started=started)]
    for holder in stale_locks:
        _write_lock(work, **holder)
        path = lock.hold(work, 0)
        assert f"taking over a stale lock of pid {holder['pid']} on" in capsys.readouterr().out, holder
        assert lock.holder_of(path) == {"host": socket.gethostname(), "pid": os.getpid(), "boot_id": boot,
                                        "pid_started": _proc_identity(os.getpid())[1],
                                        "started": lock.holder_of(path)["started"]}
        lock.release(path)
    for holder in [dict(pid=pid, boot_id=boot, pid_started=started), dict(pid=pid)]:  # the holder runs (old format too)
        _write_lock(work, **holder)
        with pytest.raises(lock.WorkdirBusy, match=f"{work} is in use by pid {pid} on"):
            lock.hold(work, 0)


@pytest.mark.parametrize("content", ["{}", "[]", '"lock"', '{"pid": "abc"}', '{"host": "HOST", "pid": "abc"}',
                                     '{"host": "HOST", "pid": 0}', '{"host": "HOST", "pid": true}',
                                     '{"host": "HOST", "pid": 5, "pid_started": "x"}'])
def test_a_malformed_lock_ends_in_one_line_naming_it(tmp_path, content):
    """Issue 24: `{}`, `[]` or `{"pid": "abc"}` in WORKDIR/lock gave a bare traceback (KeyError, AttributeError,
    ValueError); pid 0 was "in use by pid 0". A file that is JSON but no lock of ours was written by someone
    else, so the job stops and says to remove it, rather than guess that no job runs there. (A lock that is
    not JSON at all is what our own writer leaves when it dies between creating and writing it: stale.)"""
    from train import lock
    path = tmp_path / "lock"
    path.write_text(content.replace("HOST", socket.gethostname()))
    with pytest.raises(SystemExit, match=f"^error: {path}: not a lock of python -m train .*remove it") as exit:
        lock.hold(str(tmp_path), 0)
    assert type(exit.value).__name__ == "WorkdirLockError"
    assert path.read_text() == content.replace("HOST", socket.gethostname())  # left for a person to look at


def test_a_lock_being_written_is_not_taken_over(tmp_path, live_process):
    """A job creates the lock, then writes its name: a second job that reads the empty file in between
    waits for the name (WRITE_GRACE_S) instead of taking it over as a dead writer's, which let both run."""
    import threading
    import time

    from train import lock
    path, outcome = tmp_path / "lock", []
    path.write_text("")  # created by the first job, not yet written

    def second_job():
        try:
            outcome.append(lock.hold(str(tmp_path), 0))
        except SystemExit as error:
            outcome.append(error)

    thread = threading.Thread(target=second_job)
    thread.start()
    time.sleep(0.5)
    boot, started = _proc_identity(live_process.pid)
    _write_lock(str(tmp_path), pid=live_process.pid, boot_id=boot, pid_started=started)
    thread.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], lock.WorkdirBusy), outcome


def _as_a_user_who_cannot_write_everywhere() -> list[str]:
    """A command prefix under which a chmod 555 folder is read-only: none for a user; for root, setpriv
    drops the capability that lets root write anywhere (a read-only mount would need privileges)."""
    import shutil
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root writes a chmod 555 folder anyway, and setpriv (util-linux) is not installed")
    return ["setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]


def test_a_read_only_workdir_ends_in_one_line_naming_it(tmp_path):
    """Issue 24: a workdir where the lock cannot be created gave a bare PermissionError traceback."""
    work = tmp_path / "run"
    work.mkdir()
    os.chmod(work, 0o555)
    try:
        cmd = [*_as_a_user_who_cannot_write_everywhere(), sys.executable, "-m", "train", "--data", str(tmp_path),
               "--device", "cpu", "--epochs", "1", "--workdir", str(work)]
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    finally:
        os.chmod(work, 0o755)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1] == (f"error: cannot write the lock {work}/lock (Permission denied); "
                                                   f"make {work} writable, or use another --workdir")


@pytest.mark.parametrize("manifest", [True, False])
def test_a_label_offset_that_makes_class_0_negative_ends_the_run_in_one_line(tiny, tmp_path, manifest):
    """Issue 19: --label-offset 1 on 0-based TFRecords turned class 0 into the padding marker and trained on.
    Now refused, with one line naming the offset (at open from the manifest; without one, from a shard's
    first record or in the graph with the first batch holding class 0: test_labels.py), exit status 1."""
    from dali_pipes import open_source
    from dali_pipes.tools.convert import write_tfrecords
    write_tfrecords(open_source(str(tiny / "train")), str(tmp_path / "tfr"), shards=2, progress=False)
    if not manifest:
        os.remove(tmp_path / "tfr" / "manifest.json")
    cmd = [sys.executable, "-m", "train", "--data", str(tmp_path / "tfr"), "--device", "cpu", "--arch", "resnet10",
           "--width", "16", "--image-size", "32", "--batch-size", "8", "--epochs", "1", "--threads", "1",
           "--workdir", str(tmp_path / "run"), "--label-offset", "1"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 1 and "Traceback" not in run.stderr
    line = run.stderr.strip().splitlines()[-1].split("step/s]")[-1]  # after a progress bar, when one started
    assert line.startswith("error: ") and "label offset 1" in line and "negative. Check --label-offset" in line
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")


def sizes_and_labels(workdir, rank):
    """{step: (image side, labels)} of a --record-labels run."""
    with open(workdir / f"labels-rank{rank}.jsonl") as f:
        return {e["step"]: (e["image_size"], e["labels"]) for e in map(json.loads, f)}


def test_progressive_resizing_compiles_the_training_graph_once_per_size(tiny, tmp_path):
    """2 sizes over 3 epochs with --compile (inductor, CPU): dynamo's counter says exactly one graph
    compiled at each size's first epoch, none after; the val graph is not compiled (evaluate runs
    the plain model). Each epoch's size is in metrics.jsonl, and the lr is that of a run at one size."""
    run = torchrun(tmp_path / "scheduled", tiny / "train", "--image-size", "0:32,1:48", "--compile", epochs=3,
                   nproc=1, val=tiny / "val")
    history = metrics(tmp_path / "scheduled")
    assert [(h["epoch"], h["image_size"], h["compiles"]) for h in history] == [(0, 32, 1), (1, 48, 1), (2, 48, 0)], \
        run.stdout[-3000:]
    assert all(h["val_image_size"] == 48 and h["val_samples"] == 37 for h in history)
    assert history[0]["compile_s"] > 0 and history[2]["compile_s"] == 0
    torchrun(tmp_path / "fixed", tiny / "train", epochs=3, nproc=1)
    assert [h["lr"] for h in history] == [h["lr"] for h in metrics(tmp_path / "fixed")]
    assert [h["image_size"] for h in metrics(tmp_path / "fixed")] == [32, 32, 32]


def test_a_run_killed_in_the_second_size_resumes_on_the_same_batches(tiny, tmp_path):
    """Sizes 32, 40, 48 for epochs 0, 1, 2 (6 steps each, 2 ranks): killed after step 10, resumed from
    the step-8 checkpoint (epoch 1, batch 2: mid second size); every step's labels and image size,
    on both ranks, are the uninterrupted run's."""
    whole, crashed = tmp_path / "whole", tmp_path / "crashed"
    common = ("--record-labels", "--checkpoint-every", "4", "--image-size", "0:32,1:40,2:48")
    torchrun(whole, tiny / "train", *common, epochs=3)
    killed = torchrun(crashed, tiny / "train", *common, epochs=3, check=False, env=crash_test(10))
    assert killed.returncode != 0
    resumed = torchrun(crashed, tiny / "train", *common, "--resume", epochs=3)
    assert "at step 8" in resumed.stdout
    for rank in (0, 1):
        expected = sizes_and_labels(whole, rank)
        assert [expected[s][0] for s in sorted(expected)] == [32] * 6 + [40] * 6 + [48] * 6
        assert sizes_and_labels(crashed, rank) == expected
    assert [m["image_size"] for m in metrics(crashed)] == [32, 40, 48]


@pytest.mark.parametrize("manifest", [False, True])
def test_a_label_at_or_above_num_classes_ends_the_run_naming_the_record(tmp_path, manifest):
    """Issue 24: with no classes.json, --num-classes 4 was not a label check: label 9 reached the loss as
    torch's "IndexError: Target 9 is out of bounds" (a device-side assert on a GPU), naming nothing. The count
    the run uses bounds the labels: the batch holding record 5 fails, named (shard#record), in one line. With a
    manifest (labels 0 .. 9, no classes), open already refuses it from the manifest's range."""
    from dali_pipes.data.formats import tfrecord
    from dali_pipes.data.manifest import build, write

    from conftest import jpeg_bytes
    folder = tmp_path / "tfr"
    folder.mkdir()
    shard = folder / "train-00000-of-00001.tfrecord"
    labels = [9 if i == 5 else i % 4 for i in range(16)]
    with open(shard, "wb") as f:
        for i, label in enumerate(labels):
            f.write(tfrecord.frame_record(tfrecord.encode_example({"image/encoded": jpeg_bytes(i),
                                                                  "image/class/label": label})))
    if manifest:
        write(str(folder), build("tfrecord", None, [{"name": shard.name, "bytes": os.path.getsize(shard),
                                                     "samples": 16, "labels": [0, 9]}]))
    cmd = [sys.executable, "-m", "train", "--data", str(folder), "--device", "cpu", "--arch", "resnet10",
           "--width", "16", "--image-size", "32", "--batch-size", "8", "--epochs", "1", "--threads", "1",
           "--workdir", str(tmp_path / "run"), "--num-classes", "4"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 1 and "Traceback" not in run.stderr and "IndexError" not in run.stderr, run.stderr[-3000:]
    line = run.stderr.strip().splitlines()[-1].split("step/s]")[-1]  # after a progress bar, when one started
    where = f"error: {folder}: " if manifest else f"error: {shard}#5: "
    assert line.startswith(where) and "label 9 is not below the 4 classes of the run (num_classes=4, --num-classes)" \
        in line, line
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")


class _RunsCodeOnLoad:
    """An object whose unpickling opens (creates) a file: what a checkpoint copied from elsewhere could carry."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_resume_refuses_a_checkpoint_whose_unpickling_runs_code(tmp_path):
    """--resume loads with weights_only=True: the object is refused, its code never runs (load_checkpoint refuses
    before it touches the run). A checkpoint of this loop loads so (test_redact's training run checks it)."""
    import torch

    from train.checkpoint import load_checkpoint
    marker, path = tmp_path / "code-ran", tmp_path / "checkpoint.pt"
    torch.save({"model": {"weight": torch.zeros(2)}, "ranks": [_RunsCodeOnLoad(marker)]}, path)
    with pytest.raises(SystemExit, match=r"checkpoint.pt holds more than weights and numbers, and loading it could "
                                         r"run code \(.*Unsupported global.*\); .*start afresh with a new --workdir"):
        load_checkpoint(None, str(path))  # type: ignore[arg-type]
    assert not marker.exists()


def _train(work, data, *extra, epochs=1):
    cmd = [sys.executable, "-m", "train", "--data", str(data), "--device", "cpu", "--arch", "resnet10", "--width", "8",
           "--image-size", "32", "--batch-size", "16", "--epochs", str(epochs), "--threads", "1", "--workdir",
           str(work), *map(str, extra)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_second_run_in_a_workdir_is_refused_unless_resumed_or_overwritten_and_each_line_names_its_run(tmp_path):
    """Issue 32: a second `python -m train` into the same workdir overwrote the first run's checkpoint and added
    its epochs to the same metrics.jsonl. Now refused in one line; --resume goes on under the same run_id,
    --overwrite starts a new run whose lines carry a new one. The start-up line names the data found."""
    tiny, work = tmp_path / "data", tmp_path / "run"
    _learnable(tiny / "train", 4, 0)  # 16 train
    _learnable(tiny / "val", 1, 1)    # 4 val
    first = _train(work, tiny / "train")
    assert first.returncode == 0, first.stderr[-3000:]
    assert (f"data: {tiny}/train (folder): 16 images, 4 classes; val: {tiny}/val (folder): 4 images, found beside "
            f"the train data") in first.stdout.splitlines()
    (run_id,) = {line["run_id"] for line in metrics(work)}
    before = (work / "checkpoint.pt").read_bytes(), (work / "metrics.jsonl").read_text()
    again = _train(work, tiny / "train")
    assert again.returncode == 1 and again.stderr.strip().splitlines() == [
        f"error: {work}: holds another run's checkpoint ({work}/checkpoint.pt); a new run would overwrite it and add "
        f"its epochs to that run's metrics.jsonl. Pass --resume to continue that run, --overwrite to start a new one "
        f"there, or another --workdir"]
    assert ((work / "checkpoint.pt").read_bytes(), (work / "metrics.jsonl").read_text()) == before
    resumed = _train(work, tiny / "train", "--resume", epochs=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [(line["epoch"], line["run_id"]) for line in metrics(work)] == [(0, run_id), (1, run_id)]
    fresh = _train(work, tiny / "train", "--overwrite")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    ids = [line["run_id"] for line in metrics(work)]
    assert ids[:2] == [run_id, run_id] and len(ids) == 3 and ids[2] != run_id
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", ids[2])


def test_data_smaller_than_one_batch_ends_in_one_error_line(tmp_path):
    """Issue 32: a dataset smaller than one batch ended `python -m train` in a 23-line traceback."""
    data = _numbered(tmp_path / "few", 3)
    run = _train(tmp_path / "run", data)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        f"error: {data}: 3 samples over 1 ranks give less than one batch of 16 per rank in train mode (the tail is "
        f"dropped). Lower batch_size (--batch-size) to at most 3, or give more data"]


@pytest.fixture(scope="module")
def configured(tmp_path_factory):
    """A tiny run whose flags come from a YAML file (seed, label smoothing, batch size) and the command line, which
    overrides the file's batch size: (its folder, the run)."""
    root = tmp_path_factory.mktemp("configured")
    _learnable(root / "data" / "train", 4, 0)  # 16 train
    _learnable(root / "data" / "val", 1, 1)    # 4 val
    (root / "run.yaml").write_text("seed: 3\nlabel-smoothing: 0.2\nbatch_size: 32\nwarmup_epochs: 0.5\n")
    run = _train(root / "run", root / "data" / "train", "--config", root / "run.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    return root, run


def test_each_printed_epoch_line_splits_into_key_value_words_that_match_metrics_jsonl(configured):
    """Issue 36: `gpu_memory_unmeasured=no CUDA device (torch ...)` broke the printed line's KEY=VALUE words. Each
    word now splits with shlex, and its value is metrics.jsonl's (floats to 4 significant digits)."""
    root, run = configured
    lines = [line for line in run.stdout.splitlines() if line.startswith("epoch=")]
    assert len(lines) == 1
    for line, record in zip(lines, metrics(root / "run")):
        words = dict(word.split("=", 1) for word in shlex.split(line))
        assert set(words) == set(record) - {"ranks", "verdict"}
        assert words == {k: f"{v:.4g}" if isinstance(v, float) else str(v) for k, v in record.items() if k in words}
    assert words["gpu_memory_unmeasured"].startswith("no CUDA device (torch ")  # the CPU machine's reason, whole


def test_a_config_file_sets_the_flags_and_the_runs_args_json_given_back_reproduces_it(configured):
    """Issue 36: args.json could not be given back. `--config FILE` (YAML here) sets flags, the command line
    overrides it, args.json holds the effective flags without those of one invocation (config, resume,
    resume_if_present, overwrite), and `--config WORKDIR/args.json` runs the same settings again."""
    root, _ = configured
    saved = json.load(open(root / "run" / "args.json"))
    assert (saved["seed"], saved["label_smoothing"], saved["batch_size"], saved["warmup_epochs"]) == (3, 0.2, 16, 0.5)
    assert not {"config", "resume", "resume_if_present", "overwrite"} & set(saved)
    again = subprocess.run([sys.executable, "-m", "train", "--config", str(root / "run" / "args.json"), "--workdir",
                            str(root / "again")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.load(open(root / "again" / "args.json")) == {**saved, "workdir": str(root / "again")}
    assert json.load(open(root / "again" / "config.json")) == json.load(open(root / "run" / "config.json"))
