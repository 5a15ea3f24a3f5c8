"""Object stores on 127.0.0.1 for tests and benchmarks, each a child process stopped on exit:

    GcsEmulator     gcp-storage-emulator (PyPI), GCS's JSON API in memory: STORAGE_EMULATOR_HOST
    Azurite         Azure Blob's emulator (npm, `npx azurite-blob`), in memory, telemetry off:
                    AZURE_STORAGE_CONNECTION_STRING with its well-known development account
    HttpFileServer  a folder over HTTP/1.1 with HEAD, Range, ETag and If-Match (python -m http.server has
                    no Range): what a static file server or a CDN answers

    with GcsEmulator() as gcs:
        os.environ["STORAGE_EMULATOR_HOST"] = gcs.endpoint
    python -m dali_pipes_bench.store_servers http --root DIR      # prints "listening http://127.0.0.1:PORT"

None of them reaches another address: each binds 127.0.0.1 and Azurite runs with --disableTelemetry.
"""

from __future__ import annotations

import argparse
import contextlib
import email.utils
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

from dali_pipes_bench.latency_proxy import stop_process

LOOPBACK = "127.0.0.1"
# Azurite's fixed development account: its documented name and key, not a secret.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float, what: str) -> None:
    """Return once something listens on 127.0.0.1:port; RuntimeError (with the process's output) when
    it exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode}: {_output(process)}")
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex((LOOPBACK, port)) == 0:
                return
        time.sleep(0.2)
    stop_process(process)
    raise RuntimeError(f"{what} did not listen on {LOOPBACK}:{port} within {timeout:.0f} s: {_output(process)}")


def _output(process: subprocess.Popen) -> str:
    log = getattr(process, "log_path", None)
    if log is None or not os.path.exists(log):
        return ""
    with open(log, errors="replace") as f:
        return f.read()[-2000:]


class _ServerProcess:
    """A child process listening on a free port of 127.0.0.1; `endpoint` is http://127.0.0.1:PORT."""
    what = "server"
    start_timeout = 60.0

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://{LOOPBACK}:{self.port}"
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def __enter__(self):
        import tempfile
        handle, log = tempfile.mkstemp(prefix="dali_pipes-server-", suffix=".log")
        # Output to a file, not a pipe nobody reads (a full pipe would stall the server); its own session,
        # so that stopping it stops its children too (npx runs node).
        self.process = subprocess.Popen(self.command(), stdout=handle, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        os.close(handle)
        self.process.log_path = log  # type: ignore[attr-defined]  # read by _output on failure
        try:
            wait_for_port(self.port, self.process, self.start_timeout, self.what)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)  # the group this server started (npx and its node)
        stop_process(process)
        if process is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(process.log_path)  # type: ignore[attr-defined]


class GcsEmulator(_ServerProcess):
    """gcp-storage-emulator in memory."""
    what = "gcp-storage-emulator"

    def command(self) -> list[str]:
        binary = shutil.which("gcp-storage-emulator") or os.path.join(os.path.dirname(sys.executable),
                                                                      "gcp-storage-emulator")
        return [binary, "start", "--port", str(self.port), "--host", LOOPBACK, "--in-memory", "--quiet"]


def azurite_missing() -> str | None:
    """Why Azurite cannot run here (no Node.js / npx), or None."""
    return None if shutil.which("npx") and shutil.which("node") else "Azurite needs Node.js and npx on PATH"


class Azurite(_ServerProcess):
    """Azurite's blob service in memory (npx fetches the npm package on first use)."""
    what = "Azurite (npx azurite-blob)"
    start_timeout = 180.0  # the first run downloads the package

    def command(self) -> list[str]:
        return ["npx", "--yes", "-p", "azurite", "azurite-blob", "--blobHost", LOOPBACK, "--blobPort", str(self.port),
                "--inMemoryPersistence", "--skipApiVersionCheck", "--loose", "--silent", "--disableTelemetry"]

    def connection_string(self, endpoint: str | None = None) -> str:
        """AZURE_STORAGE_CONNECTION_STRING of the development account at `endpoint` (a proxy in front)."""
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                f"BlobEndpoint={endpoint or self.endpoint}/{AZURITE_ACCOUNT};")


class HttpFileServer(_ServerProcess):
    """`root` served over HTTP by this module's RangeHandler; `url(path)` names a file below it."""
    what = "HTTP file server"

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root

    def command(self) -> list[str]:
        return [sys.executable, "-m", "dali_pipes_bench.store_servers", "http", "--root", self.root,
                "--port", str(self.port)]

    def url(self, path: str = "") -> str:
        return f"{self.endpoint}/{path}"


class RangeHandler(SimpleHTTPRequestHandler):
    """Static files with what object readers need: Content-Length, Accept-Ranges, ETag (size and mtime,
    as nginx makes it), Last-Modified, single byte ranges (206) and If-Match (412 when it differs)."""
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404, "no such file")
            return
        stat = os.stat(path)
        etag = f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'
        wanted = self.headers.get("If-Match")
        if wanted and wanted not in ("*", etag):
            self.send_error(412, "ETag does not match")
            return
        start, end = self._range(stat.st_size)
        self.send_response(206 if (start, end) != (0, stat.st_size) else 200)
        self.send_header("Content-Length", str(end - start))
        if (start, end) != (0, stat.st_size):
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{stat.st_size}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", email.utils.formatdate(stat.st_mtime, usegmt=True))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if body:
            with open(path, "rb") as f:
                f.seek(start)
                self.wfile.write(f.read(end - start))

    def _range(self, size: int) -> tuple[int, int]:
        """[start, end) of a "bytes=a-b" Range header; the whole file without one."""
        text = self.headers.get("Range", "")
        if not text.startswith("bytes=") or "," in text:
            return 0, size
        first, _, last = text[len("bytes="):].partition("-")
        if not first:
            return max(0, size - int(last)), size
        return int(first), min(size, int(last) + 1) if last else size


def serve_http(root: str, port: int) -> None:
    handler = lambda *a, **kw: RangeHandler(*a, directory=root, **kw)
    server = ThreadingHTTPServer((LOOPBACK, port), handler)
    print(f"listening http://{LOOPBACK}:{server.server_address[1]}", flush=True)
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["http"])
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    serve_http(args.root, args.port)


if __name__ == "__main__":
    main()
