"""Object stores on 127.0.0.1 for tests and benchmarks, each a child process stopped on exit:

    GcsEmulator     gcp-storage-emulator (PyPI), GCS's JSON API in memory: STORAGE_EMULATOR_HOST
    Azurite         Azure Blob's emulator (npm, `npx azurite-blob`), in memory, telemetry off:
                    AZURE_STORAGE_CONNECTION_STRING with its well-known development account
    HttpFileServer  a folder over HTTP/1.1 with HEAD, Range, ETag and If-Match (python -m http.server has
                    no Range): what a static file server or a CDN answers
    HubMirror       a folder as the Hugging Face Hub's API and file routes (HubHandler): HF_ENDPOINT

    with GcsEmulator() as gcs:
        os.environ["STORAGE_EMULATOR_HOST"] = gcs.endpoint
    python -m dali_pipes_bench.servers.store_servers http --root DIR      # prints "listening http://127.0.0.1:PORT"
    python -m dali_pipes_bench.servers.store_servers hub --root DIR [--token T] [--gated ORG/NAME] [--page-size N]

None of them reaches another address: each binds 127.0.0.1 and Azurite runs with --disableTelemetry.
"""

from __future__ import annotations

import argparse
import contextlib
import email.utils
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer

from dali_pipes_bench.servers.latency_proxy import stop_process

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
        return [sys.executable, "-m", "dali_pipes_bench.servers.store_servers", "http", "--root", self.root,
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
        start, end = byte_range(self.headers.get("Range", ""), stat.st_size)
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



def byte_range(text: str, size: int) -> tuple[int, int]:
    """[start, end) of a "bytes=a-b" Range header (`text`) on `size` bytes; the whole file without one."""
    if not text.lower().startswith("bytes=") or "," in text:
        return 0, size
    first, _, last = text[len("bytes="):].partition("-")
    if not first:
        return max(0, size - int(last)), size
    return int(first), min(size, int(last) + 1) if last else size


# ---------------------------------------------------------------------------------------------
# The Hugging Face Hub, as far as HfFileSystem reads it (huggingface_hub 2.4: hf_api.py, hf_file_system.py)
# ---------------------------------------------------------------------------------------------

HUB_API = re.compile(r"^/api/(models|datasets|spaces)/([^/]+/[^/]+)(?:/(tree|paths-info|revision)/([^/]+)(?:/(.*))?)?$")
HUB_RESOLVE = re.compile(r"^/(?:(datasets|spaces)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
GIT_SUFFIXES = (".txt", ".json", ".md", ".csv", ".gitattributes")  # kept in git; every other file in LFS
RACY_S = 2.0  # a file changed more recently than this is hashed on each request (_file_ids)


class HubMirror(_ServerProcess):
    """`root` served as the Hub by HubHandler: root/<datasets|models|spaces>/ORG/NAME/<revision>/<files>, each
    revision a folder named quote(revision, safe="") ("main": the default). `token`: every request must carry
    "Authorization: Bearer <token>" (all repos private); `gated`: repos ("datasets/ORG/NAME") whose files are
    refused with 403 GatedRepo; `page_size`: entries per page of a tree listing (the Hub's: 1000)."""
    what = "Hub mirror"

    def __init__(self, root: str, token: str | None = None, gated: tuple[str, ...] = (), page_size: int = 1000) -> None:
        super().__init__()
        self.root, self.token, self.gated, self.page_size = root, token, gated, page_size

    def command(self) -> list[str]:
        return [sys.executable, "-m", "dali_pipes_bench.servers.store_servers", "hub", "--root", self.root, "--port",
                str(self.port), "--page-size", str(self.page_size), *(["--token", self.token] if self.token else []),
                *[arg for repo in self.gated for arg in ("--gated", repo)]]

    def folder(self, repo: str, revision: str = "main") -> str:
        """Where the files of `repo` ("datasets/ORG/NAME") at `revision` live."""
        return os.path.join(self.root, *repo.split("/"), urllib.parse.quote(revision, safe=""))


class _QueuingServer(ThreadingHTTPServer):
    """A threaded server that queues a burst of connections as a store's front end does: socketserver's
    backlog of 5 drops the SYNs of the rest (16 threads' HEADs at once), and each waits 1 s to resend."""
    daemon_threads = True
    request_queue_size = 128


class _HubServer(_QueuingServer):
    def __init__(self, port: int, root: str, token: str | None, gated: list[str], page_size: int) -> None:
        super().__init__((LOOPBACK, port), HubHandler)
        self.root, self.token, self.gated, self.page_size = root, token, set(gated), page_size


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(seconds))


def _file_ids(path: str) -> tuple[str, str]:
    """(git blob id, sha256) of a file: the Hub's "oid" and its LFS oid. Hashed once per version of the file
    (inode, size, mtime, ctime), not per request: the Hub stores them, and a mirror that hashes a shard on each
    ranged GET and HEAD spends the CPU a benchmark on the same host means for decoding. A file changed in the
    last RACY_S seconds is hashed afresh each time, as git does: file times tick coarsely (a few ms), so a
    rewrite of the same size could keep them."""
    stat = os.stat(path)
    if time.time() - max(stat.st_mtime, stat.st_ctime) < RACY_S:
        return _hashed.__wrapped__(path, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    return _hashed(path, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


@functools.lru_cache(maxsize=4096)
def _hashed(path: str, inode: int, size: int, mtime_ns: int, ctime_ns: int) -> tuple[str, str]:
    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(), hashlib.sha256(data).hexdigest()


class HubHandler(BaseHTTPRequestHandler):
    """The routes and JSON shapes HfFileSystem uses: repo info (GET /api/{type}s/{id}[/revision/{rev}]), tree
    listings (GET .../tree/{rev}[/{path}], recursive, paged with a Link header), paths-info (POST), and files
    (GET/HEAD /[{type}s/]{id}/resolve/{rev}/{path}, with Range). Errors carry the Hub's X-Error-Code."""
    protocol_version = "HTTP/1.1"
    server: _HubServer

    def log_message(self, format: str, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()

    def _route(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""  # read before any reply: the connection is reused
        url = urllib.parse.urlsplit(self.path)
        self.query = urllib.parse.parse_qs(url.query)
        if self._denied():
            return
        api, resolve = HUB_API.match(url.path), HUB_RESOLVE.match(url.path)
        if api:
            kind, repo, action, revision, rest = (urllib.parse.unquote(g) if g else g for g in api.groups())
            self._api(f"{kind}/{repo}", action, revision or "main", rest or "")
        elif resolve:
            kind, repo, revision, rest = (urllib.parse.unquote(g) if g else g for g in resolve.groups())
            self._resolve(f"{kind or 'models'}/{repo}", revision, rest)  # a model's route has no prefix
        else:
            self._error(404, "", "no such route")

    def _denied(self) -> bool:
        """As the Hub for a private repo: no token, 401 RepoNotFound; a wrong one, 401 invalid credentials."""
        token = self.server.token
        sent = self.headers.get("Authorization")
        if token is None or sent == f"Bearer {token}":
            return False
        if sent is None:
            self._error(401, "RepoNotFound", "Repository not found")
        else:
            self._error(401, "", "Invalid credentials in Authorization header")
        return True

    def _folder(self, repo: str, revision: str) -> str | None:
        """The revision's folder; None after answering 404 RepoNotFound or RevisionNotFound."""
        base = os.path.join(self.server.root, *repo.split("/"))
        folder = os.path.join(base, urllib.parse.quote(revision, safe=""))
        if not os.path.isdir(base):
            self._error(404, "RepoNotFound", "Repository not found")
        elif not os.path.isdir(folder):
            self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
        else:
            return folder
        return None

    def _api(self, repo: str, action: str | None, revision: str, path: str) -> None:
        folder = self._folder(repo, revision)
        if folder is None:
            return
        commit = hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()
        expand = self._flag("expand")
        if action in (None, "revision"):
            files = [p for p, is_dir in _walk(folder, "", recursive=True) if not is_dir]
            self._json({"id": repo.split("/", 1)[1], "sha": commit, "private": self.server.token is not None,
                        "gated": "auto" if repo in self.server.gated else False,
                        "lastModified": _iso(os.stat(folder).st_mtime), "siblings": [{"rfilename": p} for p in files]})
        elif action == "paths-info":
            form = urllib.parse.parse_qs(self.body.decode())
            expand = form.get("expand", ["false"])[0].lower() == "true"
            paths = [p for p in form.get("paths", []) if os.path.exists(os.path.join(folder, p))]
            self._json([_path_info(folder, p, commit if expand else None) for p in paths])
        elif path and not os.path.isdir(os.path.join(folder, path)):
            self._error(404, "EntryNotFound", f"{path} does not exist on \"{revision}\"")
        else:
            self._tree(folder, path, commit if expand else None)

    def _flag(self, name: str) -> bool:
        return self.query.get(name, ["false"])[0].lower() == "true"

    def _tree(self, folder: str, path: str, commit: str | None) -> None:
        """One page of the listing below `path`, from ?cursor=K; a Link to the next page while there is one."""
        entries = _walk(folder, path, recursive=self._flag("recursive"))
        start = int(self.query.get("cursor", ["0"])[0])
        page = entries[start:start + self.server.page_size]
        headers = {}
        if start + len(page) < len(entries):
            query = {**{k: v[0] for k, v in self.query.items()}, "cursor": str(start + len(page))}
            split = urllib.parse.urlsplit(self.path)
            headers["Link"] = (f"<http://{self.headers['Host']}{split.path}?{urllib.parse.urlencode(query)}>; "
                               f'rel="next"')
        self._json([_path_info(folder, p, commit) for p, _ in page], headers)

    def _resolve(self, repo: str, revision: str, path: str) -> None:
        folder = self._folder(repo, revision)
        if folder is None:
            return
        if repo in self.server.gated:
            self._error(403, "GatedRepo", f"Access to dataset {repo.split('/', 1)[1]} is restricted. You must have "
                                          f"access to it and be authenticated to access it. Please log in.")
            return
        file = os.path.join(folder, path)
        if not os.path.isfile(file):
            self._error(404, "EntryNotFound", "Entry not found")
            return
        size = os.path.getsize(file)
        blob, sha = _file_ids(file)
        start, end = byte_range(self.headers.get("Range", ""), size)
        self.send_response(206 if (start, end) != (0, size) else 200)
        self.send_header("Content-Length", str(end - start))
        if (start, end) != (0, size):
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{blob if path.endswith(GIT_SUFFIXES) else sha}"')
        self.send_header("X-Repo-Commit", hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest())
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if self.command != "HEAD":
            with open(file, "rb") as f:
                f.seek(start)
                self.wfile.write(f.read(end - start))

    def _json(self, value: object, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        for name, text in (headers or {}).items():
            self.send_header(name, text)
        self._send_body(body)

    def _error(self, status: int, code: str, message: str) -> None:
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self._send_body(json.dumps({"error": message}).encode())

    def _send_body(self, body: bytes) -> None:
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _walk(folder: str, below: str, recursive: bool) -> list[tuple[str, bool]]:
    """(path in the repo, is a folder) of the entries below `below`, sorted; only its children unless recursive."""
    found = []
    for current, folders, files in os.walk(os.path.join(folder, below)):
        relative = os.path.relpath(current, folder).replace(os.sep, "/")
        prefix = "" if relative == "." else relative + "/"
        found += [(prefix + name, True) for name in folders] + [(prefix + name, False) for name in files]
        if not recursive:
            break
    return sorted(found)


def _path_info(folder: str, path: str, commit: str | None) -> dict:
    """The Hub's JSON of one entry (RepoFile / RepoFolder in hf_api.py); with `commit`, its lastCommit."""
    full = os.path.join(folder, path)
    info: dict = {"path": path}
    if os.path.isdir(full):
        info.update(type="directory", oid=hashlib.sha1(path.encode()).hexdigest(), size=0)
    else:
        size = os.path.getsize(full)
        blob, sha = _file_ids(full)
        info.update(type="file", oid=blob, size=size)
        if not path.endswith(GIT_SUFFIXES):
            info["lfs"] = {"oid": sha, "size": size, "pointerSize": 134}
    if commit is not None:
        info["lastCommit"] = {"id": commit, "title": "mirror", "date": _iso(os.stat(full).st_mtime)}
    return info


def serve_hub(root: str, port: int, token: str | None, gated: list[str], page_size: int) -> None:
    server = _HubServer(port, root, token, gated, page_size)
    print(f"listening http://{LOOPBACK}:{server.server_address[1]}", flush=True)
    server.serve_forever()


def serve_http(root: str, port: int) -> None:
    handler = lambda *a, **kw: RangeHandler(*a, directory=root, **kw)
    server = _QueuingServer((LOOPBACK, port), handler)
    print(f"listening http://{LOOPBACK}:{server.server_address[1]}", flush=True)
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["http", "hub"])
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", help="hub: the Bearer token every request must carry")
    parser.add_argument("--gated", action="append", default=[], help="hub: a repo (datasets/ORG/NAME) whose "
                        "files are refused with 403 GatedRepo; repeatable")
    parser.add_argument("--page-size", type=int, default=1000, help="hub: entries per page of a tree listing")
    args = parser.parse_args(argv)
    if args.kind == "hub":
        serve_hub(args.root, args.port, args.token, args.gated, args.page_size)
    else:
        serve_http(args.root, args.port)


if __name__ == "__main__":
    main()
