"""A delaying HTTP reverse proxy on 127.0.0.1: object-store round trips, made on one machine.

Between a client (boto3, DALI's AWS SDK) and a local S3 server, every request waits `delay_ms`
before it is forwarded: the first-byte latency of a remote store, without its bandwidth limit.
Bodies stream both ways (Range requests and multi-GB objects pass through unchanged), client
connections are kept alive, and requests are counted by method, so a benchmark can report how
many GETs a reader issues. Faults can be injected for tests: answer a status (403, 500) instead
of forwarding, or cut a response body short after N bytes.

    with LatencyProxy("http://127.0.0.1:5000", delay_ms=20) as proxy:   # in this process
        os.environ["AWS_ENDPOINT_URL"] = proxy.url
    python -m dali_pipes_bench.servers.latency_proxy --upstream http://127.0.0.1:5000 --delay-ms 20

In-process use suits Python clients (boto3). A client that holds the GIL while it waits on the
network, as DALI's readers do while building a pipeline, would stall an in-process proxy: run it as
a process (`ProxyProcess`) there. GET /__proxy__/stats answers the counts as JSON.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATS_PATH = "/__proxy__/stats"
PIPE_BYTES = 1 << 16
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade"}
S3_ERROR_CODES = {403: "AccessDenied", 404: "NoSuchKey", 500: "InternalError", 503: "SlowDown"}
LOOPBACK = "127.0.0.1"


@dataclass
class Fault:
    """Requests whose path contains `path_contains` (and whose method is `method`, if given) fail:
    with `status` they are answered with that HTTP status and an S3 error body, not forwarded; with
    `truncate_at` they are forwarded but the response body stops after that many bytes and the
    connection closes. `times` limits how many requests it hits (None: all); `cleared_by` (a method,
    "HEAD") ends it at the first such request on a matching path: a store that is back once probed."""
    path_contains: str
    method: str | None = None
    status: int | None = None
    truncate_at: int | None = None
    times: int | None = None
    cleared_by: str | None = None

    def matches(self, method: str, path: str) -> bool:
        return (self.times is None or self.times > 0) and self.path_contains in path \
            and (self.method is None or self.method == method)


class LatencyProxy:
    """The proxy server; start() binds 127.0.0.1 (port 0: a free one) and serves in threads."""

    def __init__(self, upstream: str, delay_ms: float = 0.0, *, port: int = 0,
                 upstream_timeout: float = 60.0, idle_timeout: float = 30.0) -> None:
        target = urllib.parse.urlsplit(upstream)
        if target.scheme != "http" or not target.hostname:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = (target.hostname, target.port or 80)
        self.delay_s = delay_ms / 1000.0
        self.upstream_timeout = upstream_timeout
        self.idle_timeout = idle_timeout
        self._port = port
        self._lock = threading.Lock()
        self._counts: collections.Counter = collections.Counter()
        self._faults: list[Fault] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    def start(self) -> "LatencyProxy":
        self._server = _Server((LOOPBACK, self._port), _Handler, self)
        self._thread = threading.Thread(target=self._server.serve_forever, name="latency-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, close every client connection (kept-alive ones included), join."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.close_connections()
        self._server.server_close()
        self._thread.join(timeout=10)
        self._server = None

    def __enter__(self) -> "LatencyProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def counts(self) -> dict[str, int]:
        """Requests forwarded (or failed by a fault) so far, by method."""
        with self._lock:
            return dict(self._counts)

    def reset_counts(self) -> None:
        with self._lock:
            self._counts.clear()

    def add_fault(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _admit(self, method: str, path: str) -> Fault | None:
        """Count the request; the first fault that matches it (and use one of its `times`)."""
        with self._lock:
            self._counts[method] += 1
            for fault in self._faults:
                if fault.cleared_by == method and fault.path_contains in path:
                    fault.times = 0
                if fault.matches(method, path):
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a client that never closes its connection cannot hold up exit
    block_on_close = False
    request_queue_size = 128  # socketserver's backlog of 5 drops a burst's SYNs: each waits 1 s to resend

    def __init__(self, address, handler, proxy: LatencyProxy) -> None:
        self.proxy = proxy
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, handler)

    def track(self, connection: socket.socket, open_: bool) -> None:
        with self._connections_lock:
            (self._connections.add if open_ else self._connections.discard)(connection)

    def close_connections(self) -> None:
        with self._connections_lock:
            for connection in list(self._connections):
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by the client


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: each response has a length or is chunked

    def setup(self) -> None:
        self.timeout = self.server.proxy.idle_timeout  # an idle kept-alive connection closes
        super().setup()
        self.server.track(self.connection, True)
        self._upstream: http.client.HTTPConnection | None = None

    def finish(self) -> None:
        self.server.track(self.connection, False)
        if self._upstream is not None:
            self._upstream.close()
        super().finish()

    def log_message(self, format: str, *args) -> None:
        pass  # one line per request would drown a benchmark's output

    def do_GET(self) -> None:
        if self.path == STATS_PATH:
            return self._reply(200, json.dumps(self.server.proxy.counts()).encode(), "application/json")
        self._forward()

    def _forward(self) -> None:
        proxy: LatencyProxy = self.server.proxy
        fault = proxy._admit(self.command, self.path)
        if fault is not None and fault.status is not None:
            self._drain_request_body()
            return self._s3_error(fault.status)
        time.sleep(proxy.delay_s)  # the round trip to a remote store, before the request leaves
        try:
            response = self._send_upstream_retrying()
        except OSError as error:
            self.close_connection = True
            return self._reply(502, f"upstream {proxy.upstream}: {error}".encode(), "text/plain")
        try:
            self._relay(response, None if fault is None else fault.truncate_at)
        except OSError:
            # Upstream or client gone mid-body: no status can follow the headers already sent;
            # closing tells the client, and a fresh upstream connection serves the next request.
            self.close_connection = True
            self._upstream.close()
            self._upstream = None
        finally:
            response.close()

    do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    def _send_upstream_retrying(self) -> http.client.HTTPResponse:
        """A kept-alive upstream connection may have been closed by the server meanwhile: a
        bodiless request is sent once more on a fresh one (a body has been consumed already)."""
        try:
            return self._send_upstream()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            self._upstream.close()
            self._upstream = None
            if self.headers.get("Content-Length", "0") != "0" or "Transfer-Encoding" in self.headers:
                raise
            return self._send_upstream()

    def _send_upstream(self) -> http.client.HTTPResponse:
        """Send this request upstream on this client connection's own upstream connection."""
        proxy: LatencyProxy = self.server.proxy
        if self._upstream is None:
            self._upstream = http.client.HTTPConnection(*proxy.upstream, timeout=proxy.upstream_timeout)
        connection = self._upstream
        connection.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
            if name.lower() not in HOP_BY_HOP and name.lower() != "expect":
                # Host too: the client's signature covers it. Expect: 100-continue was answered
                # here already (BaseHTTPRequestHandler), and the body follows at once upstream.
                connection.putheader(name, value)
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        if chunked:
            connection.putheader("Transfer-Encoding", "chunked")
        connection.endheaders()
        if chunked:
            self._pipe_chunked_request(connection)
        else:
            self._pipe_exact(self.rfile, connection.send, int(self.headers.get("Content-Length") or 0))
        return connection.getresponse()

    def _relay(self, response: http.client.HTTPResponse, truncate_at: int | None) -> None:
        """Status, end-to-end headers and the body, streamed; cut after `truncate_at` bytes."""
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        length = response.getheader("Content-Length")
        has_body = self.command != "HEAD" and response.status not in (204, 304)
        if has_body and length is None:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not has_body:
            return
        if truncate_at is not None:
            self._pipe_exact(response, self.wfile.write, min(truncate_at, int(length or truncate_at)))
            self.close_connection = True  # the client sees the body end early, as on a dropped link
        elif length is not None:
            self._pipe_exact(response, self.wfile.write, int(length))
        else:
            self._pipe_to_chunked(response)

    @staticmethod
    def _pipe_exact(source, write, length: int) -> None:
        while length > 0:
            data = source.read(min(PIPE_BYTES, length))
            if not data:
                raise ConnectionError(f"stream ended with {length} bytes still expected")
            write(data)
            length -= len(data)

    def _pipe_to_chunked(self, response: http.client.HTTPResponse) -> None:
        while data := response.read(PIPE_BYTES):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.write(b"0\r\n\r\n")

    def _pipe_chunked_request(self, connection: http.client.HTTPConnection) -> None:
        """Copy a chunked request body upstream chunk by chunk, framing included."""
        while True:
            size_line = self.rfile.readline()
            connection.send(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                    connection.send(line)  # trailers
                connection.send(b"\r\n")
                return
            self._pipe_exact(self.rfile, connection.send, size + 2)  # data + CRLF

    def _drain_request_body(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self._pipe_exact(self.rfile, lambda data: None, length)
        elif "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True  # not worth parsing: drop the connection instead

    def _s3_error(self, status: int) -> None:
        code = S3_ERROR_CODES.get(status, "InjectedFault")
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f'<Message>injected by latency_proxy</Message></Error>').encode()
        self._reply(status, b"" if self.command == "HEAD" else body, "application/xml")

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response_only(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class ProxyProcess:
    """The proxy as a child process, for clients that hold the GIL (DALI); `stats()` reads its
    counts over HTTP. The child exits when stopped, and on its own when this process dies
    (it watches its stdin)."""

    def __init__(self, upstream: str, delay_ms: float = 0.0, start_timeout: float = 30.0, port: int = 0) -> None:
        self.upstream, self.delay_ms, self.start_timeout, self.port = upstream, delay_ms, start_timeout, port
        self._process: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> "ProxyProcess":
        command = [sys.executable, "-m", "dali_pipes_bench.servers.latency_proxy", "--upstream", self.upstream,
                   "--delay-ms", str(self.delay_ms), "--port", str(self.port), "--exit-on-stdin-eof"]
        # The child imports this package from the same checkout, installed or not.
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.url = _read_listening_line(self._process, self.start_timeout)
        return self

    @property
    def pid(self) -> int:
        return self._process.pid

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.url + STATS_PATH, timeout=10) as reply:
            return json.loads(reply.read())

    def __exit__(self, *exc) -> None:
        stop_process(self._process)


# Prints the port it got (port 0: no race for a free port) and serves until stdin closes, so the
# server also ends when its parent dies without stopping it.
_MOTO_SCRIPT = f"""
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="{LOOPBACK}", port=0, verbose=False)
server.start()
print("listening on http://{LOOPBACK}:%d" % server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""


class LocalS3Server:
    """moto's S3-compatible server (pip install 'moto[server]') as a child process on 127.0.0.1.

    A process, not a thread of the caller: DALI's S3 reader holds the GIL while it waits on the
    network (pipeline build sends HEADs), so an in-process Python server would never answer it."""

    def __init__(self, env: dict[str, str] | None = None, start_timeout: float = 60.0) -> None:
        self.env, self.start_timeout = env or {}, start_timeout
        self.endpoint = ""
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> "LocalS3Server":
        env = {**os.environ, **self.env, "NO_PROXY": LOOPBACK, "no_proxy": LOOPBACK}
        self._process = subprocess.Popen([sys.executable, "-c", _MOTO_SCRIPT], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        self.endpoint = _read_listening_line(self._process, self.start_timeout)
        return self

    @property
    def pid(self) -> int:
        return self._process.pid

    def reset(self) -> None:
        """Forget every bucket and object (moto's own reset call)."""
        request = urllib.request.Request(self.endpoint + "/moto-api/reset", method="POST")
        urllib.request.urlopen(request, timeout=10).close()

    def __exit__(self, *exc) -> None:
        stop_process(self._process)


def _read_listening_line(process: subprocess.Popen, timeout: float) -> str:
    """The URL from the child's first line, "listening on URL"; RuntimeError if it does not come."""
    timer = threading.Timer(timeout, process.kill)  # a child that never prints cannot hang us
    timer.start()
    try:
        line = process.stdout.readline().strip()
    finally:
        timer.cancel()
    if not line.startswith("listening on "):
        stop_process(process)
        raise RuntimeError(f"{process.args}: did not start within {timeout:.0f} s (said {line!r})")
    return line.split()[-1]


def stop_process(process: subprocess.Popen | None, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; always reaps the child."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            stream.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True, help="the S3 server, e.g. http://127.0.0.1:5000")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="added before each forwarded request")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--exit-on-stdin-eof", action="store_true", help="stop when the parent closes stdin")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    proxy = LatencyProxy(args.upstream, args.delay_ms, port=args.port).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if args.exit_on_stdin_eof:
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print(f"listening on {proxy.url}", flush=True)
    while not stop.wait(0.5):
        pass
    proxy.stop()


if __name__ == "__main__":
    main()
