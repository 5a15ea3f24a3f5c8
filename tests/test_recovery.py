"""Bad samples mid-run, hostile containers, and loader lifetime: each fault gives a clear error
or is excluded without losing the run's place, and nothing hangs, leaks or continues silently."""

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from dali_pipes import DaliLoader, DatasetError, open_source
from dali_pipes.data.formats import read_sample, tfrecord
from dali_pipes.tools.convert import write_tfrecords, write_webdataset
from dali_pipes.tools.verify import verify

from conftest import jpeg_bytes

N = 24
GOOD = jpeg_bytes(7, 30, 30)
BAD = {  # what a week-long run meets once in a million images
    "truncated": GOOD[: len(GOOD) // 2],
    "zero-byte": b"",
    "not a JPEG": b"GIF89a this is not what the extension says",
    "garbage": bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8)),
}


def numbered_folder(root, bad_at: dict[int, bytes]):
    """A file list of N images labelled with their index; some replaced by bad bytes."""
    root.mkdir(exist_ok=True)
    with open(root / "list.txt", "w") as f:
        for i in range(N):
            (root / f"{i:03d}.jpg").write_bytes(bad_at.get(i, jpeg_bytes(i, 20 + i % 4, 28)))
            f.write(f"{i:03d}.jpg {i}\n")
    return str(root / "list.txt")


def epoch_labels(loader):
    return [l for _, labels in loader for l in labels.tolist()]


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_file_is_named_and_the_loader_refuses_to_go_on(tmp_path, kind):
    if kind == "zero-byte":  # refused before DALI builds (it would kill the reader)
        with pytest.raises(DatasetError, match="010.jpg: empty"):
            open_source(numbered_folder(tmp_path / "d", {10: BAD[kind]}))
        return
    loader = DaliLoader(numbered_folder(tmp_path / "d", {10: BAD[kind]}), batch_size=4, train=False, device="cpu",
                        image_size=16, num_threads=1)
    with pytest.raises(DatasetError, match=r"decoding failed: .*/010.jpg: .*--write-clean-list.*skip_bad=True"):
        epoch_labels(loader)
    with pytest.raises(DatasetError, match="010.jpg"):  # and again: never a silently shorter epoch
        epoch_labels(loader)


@pytest.mark.parametrize("kind", ["truncated", "not a JPEG", "garbage"])
def test_skip_bad_excludes_the_sample_and_keeps_every_other(tmp_path, kind):
    loader = DaliLoader(numbered_folder(tmp_path / "d", {10: BAD[kind], 17: BAD["truncated"]}), batch_size=4,
                        train=False, device="cpu", image_size=16, num_threads=1, skip_bad=True)
    with pytest.warns(UserWarning, match="excluding"):
        first = epoch_labels(loader)
    second = epoch_labels(loader)
    for labels in (first, second):
        assert sorted(l for l in labels if l >= 0) == [i for i in range(N) if i not in (10, 17)]
        assert len(labels) == 24 and labels.count(-1) == 2  # excluded in place: same batches, label -1
    assert sorted(b.origin.rsplit("/", 1)[1] for b in loader.bad_samples) == ["010.jpg", "017.jpg"]


def test_skip_bad_in_train_keeps_its_place_across_ranks(tmp_path):
    """2 ranks, shuffled: the rank that meets the bad file excludes it and resumes at its last
    good batch; over the epoch every good sample of both shards arrives at most once."""
    location = numbered_folder(tmp_path / "d", {5: BAD["garbage"], 19: BAD["truncated"]})
    ranks = [DaliLoader(location, batch_size=4, train=True, device="cpu", image_size=16, num_threads=1,
                        rank=r, world_size=2, skip_bad=True, shuffle_buffer=6, seed=3) for r in range(2)]
    for _epoch in range(2):
        labels = [l for loader in ranks for l in epoch_labels(loader)]
        real = [l for l in labels if l >= 0]
        assert len(labels) == 24 and len(real) == len(set(real)) and not {5, 19} & set(real)
    assert {b.origin.rsplit("/", 1)[1] for r in ranks for b in r.bad_samples} == {"005.jpg", "019.jpg"}


@pytest.mark.parametrize("fmt", ["tfrecord", "webdataset"])
def test_garbage_record_in_a_shard(tmp_path, fmt):
    """A record whose image bytes are garbage (its CRC fine): named by shard and record, and
    excluded by rewriting that shard elsewhere with a placeholder in its place."""
    location = numbered_folder(tmp_path / "d", {})
    out = str(tmp_path / fmt)
    (write_tfrecords if fmt == "tfrecord" else write_webdataset)(open_source(location), out, shards=2, progress=False)
    source = open_source(out)
    victim = next(ref for ref in source.refs() if read_sample(ref).label == 13)
    _corrupt_image_in_place(victim)
    with pytest.raises(DatasetError, match=r"decoding failed: .*00001-of-00002|decoding failed: .*00000-of-00002"):
        epoch_labels(DaliLoader(open_source(out), batch_size=4, train=False, device="cpu", image_size=16))
    loader = DaliLoader(open_source(out), batch_size=4, train=False, device="cpu", image_size=16, skip_bad=True)
    with pytest.warns(UserWarning):
        labels = epoch_labels(loader)
    assert sorted(l for l in labels if l >= 0) == [i for i in range(N) if i != 13] and labels.count(-1) == 1
    assert sorted(l for l in epoch_labels(loader) if l >= 0) == [i for i in range(N) if i != 13]


def _corrupt_image_in_place(ref):
    """Overwrite the image bytes of one sample with garbage of the same length (valid framing;
    the TFRecord CRC is recomputed so that only the image is bad)."""
    with open(ref.path, "r+b") as f:
        if ref.kind == "tfrecord":
            (keys,) = ref.extra
            f.seek(ref.offset)
            frame = f.read(ref.size)
            data = frame[12:-4]
            example = tfrecord.decode_example(data)
            image = example[keys.image][0]
            data = data.replace(image, bytes(len(image)))  # zeros: same length, not an image
            f.seek(ref.offset)
            f.write(tfrecord.frame_record(data))
        else:
            member = ref.extra[0]
            f.seek(member.offset)
            f.write(b"\x00" * member.size)


def test_resume_after_exclusion_excludes_again(tmp_path):
    location = numbered_folder(tmp_path / "d", {9: BAD["garbage"]})
    kw = dict(batch_size=4, train=True, device="cpu", image_size=16, num_threads=1, skip_bad=True, seed=1)
    loader = DaliLoader(location, **kw)
    with pytest.warns(UserWarning):
        epoch_labels(loader)
    state = loader.state_dict()
    rest = [epoch_labels(loader) for _ in range(2)]
    resumed = DaliLoader(location, **kw)
    resumed.load_state_dict(state)
    assert [epoch_labels(resumed) for _ in range(2)] == rest  # no new warning, same batches
    assert [str(b) for b in resumed.bad_samples] == [str(b) for b in loader.bad_samples]


# ---------------------------------------------------------------------------------------------
# Hostile or broken containers
# ---------------------------------------------------------------------------------------------

def _one_shard(tmp_path, n=3):
    folder = tmp_path / "tfr"
    folder.mkdir()
    path = folder / "train-00000-of-00001"
    with open(path, "wb") as f:
        for i in range(n):
            f.write(tfrecord.frame_record(tfrecord.encode_example({"image/encoded": jpeg_bytes(i),
                                                                 "image/class/label": i})))
    return folder, path


def test_length_field_far_larger_than_the_file(tmp_path):
    folder, path = _one_shard(tmp_path)
    data = bytearray(path.read_bytes())
    length = struct.pack("<Q", 2 ** 40)  # a terabyte, with a valid length CRC
    data[:12] = length + struct.pack("<I", tfrecord.masked_crc32c(length))
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"record 0 \(byte 0\): truncated: record of 1099511627776 bytes runs "
                                           r"past the end of the file"):
        open_source(str(folder))
    [problem] = verify(str(folder), progress=False).problems
    assert "runs past the end" in problem.message


def test_crc_mismatch_is_caught_by_verification(tmp_path):
    folder, path = _one_shard(tmp_path)
    data = bytearray(path.read_bytes())
    data[40] ^= 0x01
    path.write_bytes(bytes(data))
    problems = verify(str(folder), progress=False).problems
    assert [p.message for p in problems] == ["data CRC mismatch (the record's bytes are corrupt)"]


def test_index_pointing_past_the_end(tmp_path):
    folder, path = _one_shard(tmp_path)
    open_source(str(folder))
    with open(str(path) + ".idx", "a") as f:
        f.write(f"{path.stat().st_size} 5000\n")
    with pytest.raises(DatasetError, match="no index that matches this shard"):
        open_source(str(folder), build_indexes=False)
    assert open_source(str(folder)).num_samples == 3  # rebuilt, never read as it was


def test_header_claiming_60000_by_60000_pixels(tmp_path):
    """A JPEG whose header claims 60,000 x 60,000 pixels (10 GB decoded): verification rejects
    it from the header alone, without allocating."""
    data = bytearray(jpeg_bytes(1, 8, 8))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", 60000, 60000)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "bomb.jpg").write_bytes(bytes(data))
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    [problem] = verify(str(tmp_path), progress=False, workers=1).problems
    assert problem.message.startswith("oversized: 60000 x 60000 = 3,600,000,000 pixels")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: no 10 GB allocation


# ---------------------------------------------------------------------------------------------
# Lifetime
def test_the_decode_probe_answers_for_empty_buffers_without_giving_them_to_dali():
    """DALI 2.4's CPU decoder crashes the process (a segmentation fault, no message) on a batch holding several
    dozen empty buffers: what the bad-sample search asked when many null Parquet cells came in one window. Run in
    a child process, so that a crash fails this test rather than ending the suite."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
            "from conftest import jpeg_bytes\n"
            "from dali_pipes.run.decode_probe import dali_decodes\n"
            "datas = [b'' if i % 3 else jpeg_bytes(i) for i in range(150)]\n"
            "print(dali_decodes(datas) == [i % 3 == 0 for i in range(150)])\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert (run.returncode, run.stdout.strip()) == (0, "True"), run.stderr[-2000:]


# ---------------------------------------------------------------------------------------------

def _threads_fds_rss():
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f)
    return int(status["Threads"]), len(os.listdir("/proc/self/fd")), int(status["VmRSS"].split()[0]) // 1024


def test_fifty_loaders_leak_no_threads_fds_or_memory(tmp_path):
    location = numbered_folder(tmp_path / "d", {})
    def cycle():
        loader = DaliLoader(location, batch_size=4, train=True, device="cpu", image_size=16, num_threads=2)
        for _ in loader:
            pass
        loader.close()
    for _ in range(5):
        cycle()
    threads, fds, rss = _threads_fds_rss()
    for _ in range(50):
        cycle()
    threads_after, fds_after, rss_after = _threads_fds_rss()
    assert threads_after <= threads + 2 and fds_after <= fds + 2, (threads, threads_after, fds, fds_after)
    assert rss_after - rss < 60, (rss, rss_after)  # MiB, over 50 loaders


@pytest.mark.parametrize("after", ["iteration", "error"])
def test_interpreter_exit_never_hangs(tmp_path, after):
    location = numbered_folder(tmp_path / "d", {3: BAD["garbage"]} if after == "error" else {})
    code = ("from dali_pipes import DaliLoader\n"
            f"l = DaliLoader({location!r}, batch_size=4, train=True, device='cpu', image_size=16)\n"
            "try:\n    [b for b in l]\nexcept Exception as e:\n    print(type(e).__name__)\nprint('end')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("end"), run.stderr[-2000:]
    assert ("DatasetError" in run.stdout) == (after == "error")
