"""One loader over s3:// TFRecord shards (feeds cache, native) or Parquet files (feed parquet: the Parquet
feed's own ranged reads) while the store goes away mid-epoch, in a process of its own (DALI's S3 reader keeps
the endpoint of its first use for the process's life), for tests/test_remote_feed.py. Not a test.

    python tests/s3_outage_job.py MOTO_ENDPOINT BUCKET cache|native|parquet 2s|long|probed

The AWS chain points at a proxy in front of the moto server (a process; for parquet, in this process, where
faults can be added). "2s": an uninterrupted epoch, then one with skip_bad=True during which the proxy is
down for 2 s after batch 1. "long": the proxy goes down after batch 1 and stays down (storage_attempts=2,
storage_timeout=1). "probed" (parquet): as "2s", but after batch 1 every GET of the data answers 503 until a HEAD
of it comes (the outage handler's probe: a store that is back once probed), with storage_attempts=2, so that the
fault outlasts the storage layer's retries whatever the timing. Prints one JSON line: the batches (labels,
image sums) of both epochs, the error, what the loader logged or warned about the outage, its bad samples
and those in its state.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import threading
import time
import warnings

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dali_pipes_bench.servers.latency_proxy import Fault, LatencyProxy, ProxyProcess  # noqa: E402

from conftest import jpeg_bytes  # noqa: E402
from s3_server import admin_client  # noqa: E402


class Endpoint:
    """The proxy: `stop` takes it down (connections refused), `start` brings it back on the same port.
    `in_process`: a LatencyProxy of this process, which takes faults (for Python readers only: DALI's
    hold the GIL while they wait on the network)."""

    def __init__(self, upstream: str, in_process: bool = False) -> None:
        self.upstream, self.port, self.proxy, self.in_process = upstream, 0, None, in_process

    def start(self) -> None:
        if self.in_process:
            self.proxy = LatencyProxy(self.upstream, port=self.port).start()
        else:
            self.proxy = ProxyProcess(self.upstream, port=self.port).__enter__()
        self.port = int(self.proxy.url.rsplit(":", 1)[1])

    def stop(self) -> None:
        if isinstance(self.proxy, LatencyProxy):
            self.proxy.stop()
        elif self.proxy is not None:
            self.proxy.__exit__()
        self.proxy = None


def put_shards(moto: str, bucket: str, shards: int = 12, per_shard: int = 4) -> int:
    # 12 shards: more than the reader can reach before the outage begins after batch 1, also when a loaded
    # machine lets DALI's threads run far ahead of the loop (with 6, the native reader once had it all)
    from dali_pipes.data.formats import tfrecord
    sizes = []
    for s in range(shards):
        body = b"".join(tfrecord.frame_record(tfrecord.encode_example({"image/encoded": jpeg_bytes(i),
                                                                       "image/class/label": i}))
                        for i in range(s * per_shard, (s + 1) * per_shard))
        admin_client(moto).put_object(Bucket=bucket, Key=f"train/train-{s:05d}-of-{shards:05d}", Body=body)
        sizes.append(len(body))
    return max(sizes)


def put_parquet(moto: str, bucket: str, files: int = 3, rows: int = 16) -> int:
    """`files` Parquet files of `rows` rows each (row groups of 2): binary column "jpg", int64 column "cls"."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    sizes = []
    for f in range(files):
        numbers = range(f * rows, (f + 1) * rows)
        table = pa.table({"jpg": pa.array([jpeg_bytes(i) for i in numbers], pa.binary()),
                          "cls": pa.array(list(numbers), pa.int64())})
        out = io.BytesIO()
        pq.write_table(table, out, row_group_size=2)
        admin_client(moto).put_object(Bucket=bucket, Key=f"train/train-{f:05d}-of-{files:05d}.parquet",
                                      Body=out.getvalue())
        sizes.append(len(out.getvalue()))
    return max(sizes)


def epoch(loader, endpoint: Endpoint, outage: str | None) -> list:
    """(labels, image sum) per batch; after batch 1 the outage begins: the endpoint down for 2 s ("2s") or for
    good ("long"), or GETs failing until probed ("probed")."""
    got, thread = [], None
    for i, (images, labels) in enumerate(loader):
        got.append([labels.tolist(), round(float(images.double().sum()), 3)])
        if i == 1 and outage == "probed":
            endpoint.proxy.add_fault(Fault("/train/", method="GET", status=503, cleared_by="HEAD"))
        elif i == 1 and outage is not None:
            endpoint.stop()
            if outage == "2s":
                thread = threading.Thread(target=lambda: (time.sleep(2.0), endpoint.start()))
                thread.start()
    if thread is not None:
        thread.join()
    return got


def main() -> None:
    moto, bucket, feed, outage = sys.argv[1:5]
    endpoint = Endpoint(moto, in_process=feed == "parquet")
    endpoint.start()
    os.environ.update(AWS_ENDPOINT_URL=endpoint.proxy.url, AWS_ACCESS_KEY_ID="testing",
                      AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1", AWS_REGION="us-east-1",
                      AWS_EC2_METADATA_DISABLED="true", NO_PROXY="127.0.0.1")
    empty = tempfile.NamedTemporaryFile(delete=False)
    os.environ.update(AWS_CONFIG_FILE=empty.name, AWS_SHARED_CREDENTIALS_FILE=empty.name)
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    from dali_pipes import DaliLoader, SampleKeys
    shard_bytes = put_parquet(moto, bucket) if feed == "parquet" else put_shards(moto, bucket)
    kw = dict(batch_size=2, train=True, seed=3, image_size=16, device="cpu", num_threads=1, shuffle_buffer=4,
              prefetch_queue_depth=1, remote_feed="cache" if feed == "parquet" else feed,
              cache_bytes=4 * shard_bytes, cache_prefetch=1)
    if feed == "parquet":
        kw.update(keys=SampleKeys(image_column="jpg", label_column="cls"))
    if outage in ("long", "probed"):
        kw.update(storage_attempts=2, storage_timeout=1.0 if outage == "long" else 2.0)
    url = f"s3://{bucket}/train/"
    met: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: met.append(record.getMessage())
    logging.getLogger("dali_pipes").addHandler(handler)
    result: dict = {"expected": None, "error": None, "error_type": None}
    if outage != "long":
        reference = DaliLoader(url, **kw)
        result["expected"] = epoch(reference, endpoint, None)
        reference.close()
    loader = DaliLoader(url, skip_bad=True, **kw)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            result["got"] = epoch(loader, endpoint, outage)
        except ConnectionError as error:
            result["error"], result["error_type"] = str(error), type(error).__name__
    met += [str(w.message) for w in warned if "network fault" in str(w.message)]
    result.update(met=[m for m in met if "cannot reach" in m or "network fault" in m],
                  bad_samples=[str(b) for b in loader.bad_samples],
                  state_bad_samples=loader.state_dict()["bad_samples"])
    loader.close()
    endpoint.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
