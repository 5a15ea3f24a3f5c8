"""The latency proxy passes S3 traffic through unchanged (ranges, large bodies, uploads), delays
and counts it; and DALI's native s3:// reader, measured through it, sends one GET per record."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from dali_pipes.data.formats import tfrecord
from dali_pipes.storage import remote, transfer
from dali_pipes_bench.servers.latency_proxy import Fault, LatencyProxy, ProxyProcess

pytest_plugins = ["s3_server"]  # fixtures: s3 (a bucket on a local moto server), proxy
pytest.importorskip("boto3", reason="s3:// support needs boto3: pip install '.[s3]' (from the dali_pipes checkout)")
pytest.importorskip("moto.server", reason="the S3 tests need a local S3 server: pip install 'moto[server]'")


def test_ranges_large_bodies_and_uploads_pass_through(proxy, s3, tmp_path):
    data = os.urandom(5 << 20)
    local = tmp_path / "blob"
    local.write_bytes(data)
    info = transfer.upload(str(local), s3.url("x/blob"))  # PUT through the proxy
    assert transfer.read_range(info, 1234, 10_000) == data[1234:11_234]
    assert transfer.read_bytes(info.url) == data
    counts = proxy.counts()
    assert counts["PUT"] >= 1 and counts["GET"] == 2 and counts["HEAD"] >= 1


def test_each_request_waits_the_delay(s3, monkeypatch):
    with LatencyProxy(s3.endpoint, delay_ms=100) as slow:
        monkeypatch.setenv("AWS_ENDPOINT_URL", slow.url)
        info = remote.head(s3.put("a", b"abc"))
        start = time.monotonic()
        for _ in range(3):
            transfer.read_range(info, 0, 1)
        assert time.monotonic() - start >= 0.3  # a lower bound only: sleeps are never shorter
        assert slow.counts()["GET"] == 3


def test_injected_status_is_not_forwarded(proxy, s3):
    proxy.add_fault(Fault("/a", method="HEAD", status=500, times=1))
    s3.put("a", b"abc")
    assert remote.head(s3.url("a")).size == 3  # botocore retried the 500 once
    assert proxy.counts()["HEAD"] == 2


def test_stop_closes_kept_alive_connections(s3):
    server = LatencyProxy(s3.endpoint).start()
    host, port = server.url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)), timeout=10)
    for _ in range(2):  # two requests on one connection: it is kept alive
        client.sendall(b"GET /__proxy__/stats HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while not reply.endswith(b"\r\n\r\n{}"):
            reply += client.recv(4096)
        assert reply.startswith(b"HTTP/1.1 200")
    start = time.monotonic()
    server.stop()
    assert client.recv(4096) == b"" and time.monotonic() - start < 5  # closed by stop(), not by a timeout
    client.close()


def write_tfrecord(path: str, count: int) -> bytes:
    """`count` records; record i holds image bytes [i] * (100 + i) and label i."""
    data = b"".join(tfrecord.frame_record(tfrecord.encode_example(
        {"image/encoded": bytes([i]) * (100 + i), "image/class/label": i})) for i in range(count))
    with open(path, "wb") as f:
        f.write(data)
    return data


# DALI's AWS client reads AWS_ENDPOINT_URL once per process and keeps it: a reader pointed at this
# test's proxy would keep talking to it after the proxy is gone. So DALI runs in a child process here.
_READ_NATIVELY = """
import json, sys
import numpy as np
from nvidia.dali import fn, pipeline_def, tfrecord as tfrec
url, index, count = sys.argv[1], sys.argv[2], int(sys.argv[3])

@pipeline_def(batch_size=8, num_threads=1, device_id=None)
def pipe():
    out = fn.readers.tfrecord(path=[url], index_path=[index], name="Reader",
                              features={"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                                        "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
    return out["image/encoded"], out["image/class/label"]

p = pipe()
p.build()
got = {}
for _ in range(count // 8):
    images, labels = p.run()
    for i in range(len(labels)):
        got[int(np.array(labels[i])[0])] = np.array(images[i]).tobytes().hex()
print(json.dumps(got))
"""


def test_dali_reads_s3_natively_with_one_get_per_record(s3, tmp_path):
    count = 24
    local = str(tmp_path / "x.tfrecord")
    s3.put("d/x.tfrecord", write_tfrecord(local, count))
    tfrecord.write_tfrecord_index(tfrecord.build_tfrecord_index(local), local + ".idx")
    # A proxy process, not a thread: DALI holds the GIL while it waits on its HEAD at build.
    with ProxyProcess(s3.endpoint, delay_ms=0) as counter:
        run = subprocess.run([sys.executable, "-c", _READ_NATIVELY, s3.url("d/x.tfrecord"), local + ".idx",
                              str(count)], env={**os.environ, "AWS_ENDPOINT_URL": counter.url},
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        got = {int(k): bytes.fromhex(v) for k, v in json.loads(run.stdout.splitlines()[-1]).items()}
        assert got == {i: bytes([i]) * (100 + i) for i in range(count)}
        stats = counter.stats()
    # One HEAD at build; then one ranged GET per record (plus one: the reader runs a batch ahead).
    assert stats["HEAD"] == 1 and count <= stats["GET"] <= count + 8


def test_proxy_process_reports_counts_and_stops(s3):
    with ProxyProcess(s3.endpoint, delay_ms=0) as child:
        assert child.stats() == {}
        process = child._process
    assert process.poll() is not None
    with pytest.raises(ValueError, match="http://host:port"):
        LatencyProxy("https://example.invalid")


@pytest.mark.parametrize("kind", ["proxy", "http", "hub"])
def test_bench_servers_queue_a_burst_of_connections(kind, tmp_path):
    """32 connections at once to a server that accepts none meanwhile (stopped) all complete their handshake:
    the kernel queues them. With socketserver's backlog of 5 the rest's SYNs are dropped and each client waits
    the kernel's 1 s resend, which a benchmark counts as store latency (remote.heads sends 16 HEADs at once)."""
    import select
    import signal

    from dali_pipes_bench.servers.store_servers import HttpFileServer, HubMirror
    server = {"proxy": lambda: ProxyProcess("http://127.0.0.1:9", delay_ms=0), "http": lambda: HttpFileServer(
        str(tmp_path)), "hub": lambda: HubMirror(str(tmp_path))}[kind]()
    with server:
        port = int(server.url.rsplit(":", 1)[1]) if kind == "proxy" else server.port
        os.kill(server.pid, signal.SIGSTOP)
        _wait_stopped(server.pid)  # kill() returns before each thread stops: one could still accept
        pending, connected = [socket.socket() for _ in range(32)], []
        try:
            for client in pending:
                client.setblocking(False)
                client.connect_ex(("127.0.0.1", port))
            deadline = time.monotonic() + 2.0  # a queued handshake completes in microseconds; a dropped SYN: 1 s
            while pending and time.monotonic() < deadline:
                _, ready, _ = select.select([], pending, [], 0.1)
                connected += [c for c in ready if c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0]
                pending = [c for c in pending if c not in ready]
        finally:
            os.kill(server.pid, signal.SIGCONT)
            for client in pending + connected:
                client.close()
    assert (len(connected), len(pending)) == (32, 0)


def _wait_stopped(pid: int) -> None:
    """Return once every thread of `pid` is stopped (state T in /proc/PID/task/*/stat)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(state in "tT" for state in states):
            return
        time.sleep(0.01)
    raise RuntimeError(f"process {pid} did not stop: thread states {states}")
