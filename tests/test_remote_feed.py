"""remote_feed.py: the shard cache follows what DALI's reader reads (reader.ReaderModel), so that a file
is local before the reader opens it. The case it got wrong before: an s3:// file list in train, which
DALI's file reader reads in its once-shuffled list order, not in storage order (a wrong guess is a file
the reader cannot open: DALI fails the batch)."""

import re

import pytest

from dali_pipes import DaliLoader
from dali_pipes.data.reader import ReaderModel

from conftest import jpeg_bytes

pytest_plugins = ["s3_server"]  # fixtures: s3 (a bucket on a local moto server)
pytest.importorskip("boto3", reason="s3:// support needs boto3: pip install '.[s3]' (from the dali_pipes checkout)")
pytest.importorskip("moto.server", reason="the S3 tests need a local S3 server: pip install 'moto[server]'")

N = 48  # per rank 24: more than the reader's read-ahead below, so the cache cannot just hold everything


def test_train_file_list_from_s3_through_a_small_cache(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    for i in range(N):
        s3.put(f"images/{i:03d}.jpg", jpeg_bytes(i))
    url = s3.put("images/list.txt", "".join(f"{i:03d}.jpg {i}\n" for i in range(N)).encode())
    size = len(jpeg_bytes(0)) * 4  # room for a handful of files at a time
    ranks = [DaliLoader(url, batch_size=2, train=True, rank=r, world_size=2, image_size=16, device="cpu",
                        num_threads=1, shuffle_buffer=4, prefetch_queue_depth=1, cache_bytes=max(size, 20_000),
                        cache_prefetch=1) for r in range(2)]
    try:
        # The reader's reach (reader.py's model: buffer + (queues + 2) batches) is a fraction of a slice
        assert ReaderModel(N, 0, 2, True, 2, shuffle_buffer=4, prefetch_queue_depth=1).read_ahead < N // 2
        for _ in range(2):  # slices rotate between ranks each epoch
            labels = [l for loader in ranks for _, b in loader for l in b.tolist()]
            assert len(labels) == len(set(labels)) == N  # (N // 2) // 2 full batches per rank
    finally:
        for loader in ranks:
            loader.close()


# ---------------------------------------------------------------------------------------------
# Network faults are not bad samples: an outage of the store mid-epoch, in both feeds and in Parquet's
# ---------------------------------------------------------------------------------------------
# DALI's S3 reader keeps the endpoint it first used for the life of the process, so each case runs in
# a process of its own (tests/s3_outage_job.py), with a proxy in front of this session's moto server
# that the job stops and starts (or, for Parquet, makes fail until probed).

def outage_job(s3, moto_endpoint, tmp_path, feed: str, outage: str) -> dict:
    import json
    import os
    import subprocess
    import sys
    job = os.path.join(os.path.dirname(__file__), "s3_outage_job.py")
    env = {**os.environ, "DALI_PIPES_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, job, moto_endpoint, s3.bucket, feed, outage], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("feed", ["cache", "native", "parquet"])
def test_a_2_s_outage_mid_epoch_is_ridden_out_with_the_same_batches(s3, moto_endpoint, tmp_path, feed):
    for attempt in range(4):  # DALI's reader sometimes has what it needs before the outage: then again
        result = outage_job(s3, moto_endpoint, tmp_path / str(attempt), feed, "2s")
        if result["met"] or result["error"] is not None:
            break
    assert result["error"] is None
    assert result["got"] == result["expected"] and len(result["got"]) == 24
    # the outage was met, and taken for what it is: the client retried, or the native reader waited
    assert result["met"] and all("cannot reach" in m or "a network fault, not a bad sample" in m
                                 for m in result["met"])
    assert result["bad_samples"] == [] and result["state_bad_samples"] == {"bad_samples": [], "excluded": []}


@pytest.mark.parametrize("feed", ["cache", "native", "parquet"])
def test_a_long_outage_is_a_connection_error_that_excludes_no_sample(s3, moto_endpoint, tmp_path, feed):
    result = outage_job(s3, moto_endpoint, tmp_path, feed, "long")
    assert result["error_type"] == "UnreachableError"
    assert re.search(f"s3://{s3.bucket}/train/train-.*cannot reach the S3 endpoint http://127.0.0.1:\\d+ "
                     f"after 2 attempts.*--storage-attempts", result["error"]), result["error"]
    assert result["bad_samples"] == [] and result["state_bad_samples"] == {"bad_samples": [], "excluded": []}


def test_a_parquet_read_failing_past_the_layers_retries_is_waited_out_with_the_same_batches(s3, moto_endpoint,
                                                                                              tmp_path):
    """Every GET of the data fails (503) until the outage handler probes the object: the feed's reads give up
    after their 2 attempts, the handler waits for the store and rebuilds at the last good batch."""
    result = outage_job(s3, moto_endpoint, tmp_path, "parquet", "probed")
    assert result["error"] is None
    assert result["got"] == result["expected"] and len(result["got"]) == 24
    assert any("a network fault, not a bad sample" in m for m in result["met"])
    assert result["bad_samples"] == [] and result["state_bad_samples"] == {"bad_samples": [], "excluded": []}
