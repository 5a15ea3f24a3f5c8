"""The fsspec backends of the shared layer (remote.py): gs:// (gcsfs), az:// and abfs:// (adlfs), hf://
(huggingface_hub's HfFileSystem) and http(s):// (fsspec's HTTPFileSystem).

`FsspecBackend` does what is the same for every fsspec filesystem: walk a prefix (`find`), stat an object
(`info`), read a byte range (`cat_file`), stream an object as ranged reads of REQUEST_BYTES, upload and
delete, and tell connection faults, 403s, 404s and 5xx apart. A subclass says what is its scheme's own:
how to make the filesystem (credentials the way its SDK finds them, our timeouts, no retries of its
own: remote.retrying retries), how its metadata maps to ObjectInfo, how a read is pinned to the listed
version, and the hints its errors give.

Reads are pinned where the store can (HTTP If-Match; GCS generation; Azure If-Match through its SDK); where it
cannot (the Hub, a GCS emulator that ignores generation), `pins_reads` is False and a whole download is
followed by one HEAD: a shard replaced while it was fetched is ObjectChangedError, never two versions mixed.
"""

from __future__ import annotations

import asyncio
import email.utils
import errno
import functools
import math
import os
import posixpath
from typing import Any, Iterator

from dali_pipes.storage import redact, remote, remote_urls
from dali_pipes.storage.remote import ClientOptions
from dali_pipes.storage.remote_urls import ObjectInfo, RemoteUrl

REQUEST_BYTES = 16 << 20  # one ranged GET of a streamed object: few round trips per shard at 20 ms each
RETRIED_STATUSES = (408, 429, 500, 502, 503, 504)  # restarting, throttling, timing out: worth another try


def _timestamp(value: Any) -> float:
    """POSIX seconds of a datetime, an RFC 1123 date (HTTP's Last-Modified) or a number; 0.0 if absent."""
    if value is None or value == "":
        return 0.0
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    if isinstance(value, str):
        return email.utils.parsedate_to_datetime(value).timestamp()
    return float(value)


def status_of(error: BaseException) -> int:
    """The HTTP status an SDK error carries, whatever it calls it; 0 if none."""
    for name in ("status", "status_code", "code"):
        value = getattr(error, name, None)
        if isinstance(value, int):
            return value
    response = getattr(error, "response", None)
    return int(getattr(response, "status_code", 0) or getattr(response, "status", 0) or 0)


def _causes(error: BaseException, depth: int = 4) -> Iterator[BaseException]:
    """The error and those it was raised from (an SDK that turns a refused connection into FileNotFoundError)."""
    seen: BaseException | None = error
    for _ in range(depth):
        if seen is None:
            return
        yield seen
        seen = seen.__cause__ or seen.__context__


def _connection_fault(error: BaseException) -> bool:
    """A fault of the network or the server, not of the request: refused, reset, timed out."""
    import aiohttp
    if isinstance(error, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError,
                          TimeoutError, ConnectionError)):
        return True
    if type(error).__module__.startswith("azure.core") and type(error).__name__ in (
            "ServiceRequestError", "ServiceResponseError", "ServiceRequestTimeoutError", "ServiceResponseTimeoutError"):
        return True
    if type(error).__module__.startswith(("httpx", "requests")) and any(
            word in type(error).__name__ for word in ("Connect", "Timeout", "Network", "Protocol")):
        return True
    return isinstance(error, OSError) and error.errno in (errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT)


class FsspecBackend:
    """remote.Backend over one fsspec filesystem (see module doc); subclasses make it and map its metadata."""
    service = "object store"
    endpoint_hint = "check the endpoint and that the server is up"
    permission_hint = "check the credentials in use"
    pins_reads = False

    def __init__(self, options: ClientOptions) -> None:
        self.options = options
        self.fs = self.make_fs(options)

    # --- what a subclass says --------------------------------------------------------------------
    def make_fs(self, options: ClientOptions) -> Any:
        raise NotImplementedError

    def endpoint(self, url: str = "") -> str:
        raise NotImplementedError

    def object_info(self, url: str, meta: dict) -> ObjectInfo:
        return ObjectInfo(url, int(meta["size"]), str(meta.get("etag") or meta.get("ETag") or ""),
                          _timestamp(meta.get("mtime") or meta.get("last_modified") or meta.get("LastModified")))

    def pin(self, info: ObjectInfo) -> dict:
        """cat_file keywords that make a read fail rather than return another version of the object."""
        return {}

    def credentials_error(self, error: BaseException, url: str) -> Exception | None:
        """PermissionError saying how to give credentials, when `error` says none were found."""
        return None

    # --- paths ------------------------------------------------------------------------------------
    def path(self, url: RemoteUrl) -> str:
        return f"{url.bucket}/{url.key}"

    def url_of(self, scheme: str, path: str) -> str:
        return f"{scheme}://{path}"

    # --- remote.Backend ---------------------------------------------------------------------------
    def list_prefix(self, bucket: str, prefix: str, url: str, page_size: int) -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`: one recursive `find` (fsspec pages it), retried whole.
        A pattern's literal prefix may end inside a name: then its folder is walked, no deeper than the pattern."""
        parsed = RemoteUrl.parse(url)
        pattern = remote_urls.has_wildcard(parsed.key)
        walk = posixpath.dirname(prefix) if pattern else prefix.rstrip("/")
        depth = parsed.key.count("/") - (walk.count("/") + 1 if walk else 0) + 1 if pattern else None
        root = self.path(RemoteUrl(parsed.scheme, bucket, walk))
        found = remote.retrying(url, self, lambda: self._find(root, depth))
        start = self.path(RemoteUrl(parsed.scheme, bucket, ""))
        for name, meta in found.items():
            key = name[len(start):] if name.startswith(start) else name
            if meta.get("type", "file") == "file" and key.startswith(prefix) and not key.endswith("/"):
                yield self.object_info(f"{parsed.scheme}://{bucket}/{key}", meta)

    def _find(self, root: str, depth: int | None) -> dict[str, dict]:
        found = self.fs.find(root, maxdepth=depth, detail=True)
        if isinstance(found, dict):
            return found
        # adlfs 2026.8 answers a list for a path that is one blob
        return {m["name"]: m for m in (item if isinstance(item, dict) else self.fs.info(item) for item in found)}

    def head(self, url: RemoteUrl) -> ObjectInfo:
        self.fs.invalidate_cache(self.path(url))  # else gcsfs answers from its last listing: a replaced object unseen
        meta = self.fs.info(self.path(url))
        if meta.get("type", "file") != "file":
            raise FileNotFoundError(errno.ENOENT, "a folder, not an object", str(url))
        return self.object_info(str(url), meta)

    def bucket_exists(self, url: RemoteUrl) -> bool:
        try:
            self.fs.info(url.bucket)
            return True
        except FileNotFoundError:
            return False

    def read(self, info: ObjectInfo, start: int, end: int, deadline: remote.Deadline | None = None) -> bytes:
        data = self.on_loop(deadline, self.fs._cat_file, self.path(RemoteUrl.parse(info.url)), start=start, end=end,
                            **self.pin(info))
        return remote.ranged_reply(info, start, end, data)  # a server that ignores Range sent the whole object

    def on_loop(self, deadline: remote.Deadline | None, coroutine: Any, *args: Any, **kwargs: Any) -> Any:
        """coroutine(*args, **kwargs) run on the filesystem's event loop, cancelled when `deadline` passes
        (DownloadTooSlowError): a store sending a few bytes a second never trips the read timeout."""
        from fsspec.asyn import sync
        from fsspec.exceptions import FSTimeoutError
        try:
            return sync(self.fs.loop, coroutine, *args, timeout=deadline.left() if deadline else None, **kwargs)
        except FSTimeoutError:
            if deadline is not None and deadline.passed():
                raise deadline.error() from None
            raise

    def stream(self, info: ObjectInfo, chunk_bytes: int, deadline: remote.Deadline) -> Iterator[bytes]:
        """The object as ranged reads of REQUEST_BYTES, each tried by remote.retrying, yielded in chunk_bytes."""
        for offset in range(0, info.size, REQUEST_BYTES):
            end = min(info.size, offset + REQUEST_BYTES)
            data: bytes = remote.retrying(info.url, self, functools.partial(self.read, info, offset, end, deadline),
                                          info)
            if len(data) != end - offset:
                raise remote.truncated_error(info, offset + len(data))
            for at in range(0, len(data), chunk_bytes):
                yield data[at:at + chunk_bytes]

    def upload(self, path: str, url: RemoteUrl) -> None:
        self.fs.put_file(path, self.path(url))

    def delete(self, url: RemoteUrl) -> None:
        self.fs.rm_file(self.path(url))

    def translate(self, error: Exception, url: str, expected: ObjectInfo | None) -> Exception:
        """The clear exception for an fsspec/SDK failure on `url` (see remote.py's module doc)."""
        endpoint, status = self.endpoint(url), status_of(error)
        credentials = self.credentials_error(error, url)
        if credentials is not None:
            return credentials
        fault = next((e for e in _causes(error) if _connection_fault(e)), None)  # fsspec's http wraps it
        if fault is not None:
            return ConnectionError(f"{url}: cannot reach the {self.service} endpoint {endpoint} "
                                   f"({type(fault).__name__}: {fault}); {self.endpoint_hint}")
        # fsspec's http answers any failed HEAD with FileNotFoundError, a 403 too: the status it was raised from decides
        chained = next((code for code in map(status_of, _causes(error)) if code), 0)
        if chained in (401, 403) and isinstance(error, FileNotFoundError):
            return PermissionError(f"{url}: access denied by {endpoint} ({chained}); {self.permission_hint}")
        if isinstance(error, FileNotFoundError) or status == 404:
            if expected is not None:
                return remote.disappeared_error(url, expected)
            return FileNotFoundError(f"{url}: no such object at {endpoint}; check the key")
        if isinstance(error, PermissionError) or status in (401, 403) or "Forbidden" in str(error):
            return PermissionError(f"{url}: access denied by {endpoint} ({status or type(error).__name__}); "
                                   f"{self.permission_hint}")
        if status == 412:
            return remote.changed_error(url, expected, "its ETag no longer matches (If-Match failed)")
        return error

    def retryable(self, error: Exception) -> bool:
        return status_of(error) in RETRIED_STATUSES or any(_connection_fault(e) for e in _causes(error))


def _aiohttp_timeout(options: ClientOptions):
    import aiohttp
    return aiohttp.ClientTimeout(total=None, sock_connect=options.connect_timeout, sock_read=options.read_timeout)


# ---------------------------------------------------------------------------------------------
# gs://
# ---------------------------------------------------------------------------------------------

class GcsBackend(FsspecBackend):
    """gs:// through gcsfs's JSON-API filesystem. Credentials: STORAGE_EMULATOR_HOST (an emulator, no
    credentials), else Google's default chain (GOOGLE_APPLICATION_CREDENTIALS, gcloud's login, the
    metadata server). Reads are pinned to the listed generation."""
    service = "GCS"
    endpoint_hint = ("check STORAGE_EMULATOR_HOST (an emulator; DALI_GCS_ENDPOINT_URL for DALI's own reader) or "
                     "the network, and that the server is up")
    permission_hint = "the credentials in use need storage.objects.list and storage.objects.get on the bucket"

    def make_fs(self, options: ClientOptions) -> Any:
        from gcsfs.core import GCSFileSystem  # the JSON API; gcsfs's default class probes gRPC first

        class OneTryGCS(GCSFileSystem):
            # gcsfs 2026.10 retries every request 6 times inside `_request` (its retry_request decorator); the
            # undecorated function tries once, so that remote.retrying's attempts are the only ones.
            _request = GCSFileSystem._request.__wrapped__

        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        return OneTryGCS(token="anon" if emulator else None, requests_timeout=_aiohttp_timeout(options),
                         skip_instance_cache=True, version_aware=False)

    def endpoint(self, url: str = "") -> str:
        return str(self.fs._location)

    def object_info(self, url: str, meta: dict) -> ObjectInfo:
        return ObjectInfo(url, int(meta["size"]), str(meta.get("etag", "")),
                          _timestamp(meta.get("mtime") or meta.get("updated")), str(meta.get("generation", "")))

    def pin(self, info: ObjectInfo) -> dict:
        return {"generation": info.generation} if info.generation else {}

    def native_environment(self) -> dict[str, str]:
        """What DALI 2.4's own GCS reader (google-cloud-cpp, configured by DALI_GCS_* variables alone) needs to
        reach the store gcsfs reaches: an emulator's endpoint, without credentials; and a deadline per read of
        the loader's timeout (DALI_GCS_REQUEST_TIMEOUT_SEC, which bounds its retries: else about 90 s of them
        before an unreachable store fails a read, checked on DALI 2.4)."""
        wanted = {"DALI_GCS_REQUEST_TIMEOUT_SEC": str(max(1, math.ceil(self.options.read_timeout)))}
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator:
            wanted.update(DALI_GCS_ENDPOINT_URL=emulator if "://" in emulator else f"http://{emulator}",
                          DALI_GCS_ANONYMOUS="1")
        return wanted

    def credentials_error(self, error: BaseException, url: str) -> Exception | None:
        if type(error).__module__.startswith("google.auth"):
            return PermissionError(f"{url}: no Google credentials found ({error}). Set GOOGLE_APPLICATION_CREDENTIALS "
                                   f"to a service account key file, or run: gcloud auth application-default login")
        return None



# ---------------------------------------------------------------------------------------------
# az:// and abfs://
# ---------------------------------------------------------------------------------------------

class AzureBackend(FsspecBackend):
    """az:// and abfs:// through adlfs, its conventions for credentials: AZURE_STORAGE_CONNECTION_STRING,
    or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_TOKEN, or Azure's
    default credential with AZURE_STORAGE_CLIENT_ID...)."""
    service = "Azure Blob"
    endpoint_hint = ("check the BlobEndpoint of AZURE_STORAGE_CONNECTION_STRING (or AZURE_STORAGE_ACCOUNT_NAME) "
                     "and that the server is up")
    permission_hint = "the credentials in use need read and list access to the container (Storage Blob Data Reader)"
    pins_reads = True  # If-Match on every ranged GET (read)

    def make_fs(self, options: ClientOptions) -> Any:
        from adlfs import AzureBlobFileSystem

        class OneTryAzure(AzureBlobFileSystem):
            def do_connect(self) -> None:
                super().do_connect()
                # The Azure SDK retries a request up to 3 times with 15 s+ backoff (ExponentialRetry,
                # azure-storage-blob 12.31): no retries of its own, remote.retrying's are the attempts.
                self.service_client._config.retry_policy.total_retries = 0

        if not any(os.environ.get(v) for v in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME")):
            raise PermissionError("az:// URLs need AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with "
                                  "AZURE_STORAGE_ACCOUNT_KEY (or a default Azure credential)")
        keyed = bool(os.environ.get("AZURE_STORAGE_ACCOUNT_KEY"))
        return OneTryAzure(connection_timeout=options.connect_timeout, read_timeout=options.read_timeout,
                           skip_instance_cache=True, anon=False if keyed else None)

    def read(self, info: ObjectInfo, start: int, end: int, deadline: remote.Deadline | None = None) -> bytes:
        """One ranged GET pinned to the listed ETag (If-Match: a replaced blob is a 412, ObjectChangedError).
        adlfs's cat_file passes no conditions on, so the read goes to the SDK's blob client on adlfs's loop;
        pinned, a download needs no HEAD after it: one round trip less per shard (docs/benchmarks.md, "Every
        scheme through the shard cache")."""
        if not info.etag:  # a listing always gives one; an ObjectInfo made by hand may not
            return super().read(info, start, end, deadline)
        path = self.path(RemoteUrl.parse(info.url))
        container, blob, version_id = self.fs.split_path(self.fs._strip_protocol(path))
        try:
            return self.on_loop(deadline, self._read_pinned, container, blob, version_id, start, end - start,
                                info.etag)
        except Exception as error:
            # If-Match on a deleted blob is a 412 too (Azurite): deleted is not changed
            if status_of(error) == 412 and not self.fs.exists(path):
                raise FileNotFoundError(errno.ENOENT, "deleted", info.url) from error
            raise

    async def _read_pinned(self, container: str, blob: str, version_id: str | None, start: int, length: int,
                           etag: str) -> bytes:
        from azure.core import MatchConditions
        async with self.fs.service_client.get_blob_client(container=container, blob=blob) as client:
            stream = await client.download_blob(offset=start, length=length, version_id=version_id, etag=etag,
                                                match_condition=MatchConditions.IfNotModified, max_concurrency=1,
                                                connection_timeout=self.options.connect_timeout,
                                                read_timeout=self.options.read_timeout)
            return bytes(await stream.readall())

    def endpoint(self, url: str = "") -> str:
        # a SAS connection string puts its signature in the account URL's query string
        return redact.redacted_url(str(self.fs.service_client.url)).rstrip("/")

    def object_info(self, url: str, meta: dict) -> ObjectInfo:
        return ObjectInfo(url, int(meta["size"]), str(meta.get("etag", "")), _timestamp(meta.get("last_modified")),
                          str(meta.get("version_id") or ""))

    def credentials_error(self, error: BaseException, url: str) -> Exception | None:
        if type(error).__name__ == "ClientAuthenticationError" and status_of(error) != 403:
            return PermissionError(f"{url}: Azure refused the credentials ({str(error).splitlines()[0]}); check "
                                   f"AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_KEY")
        return None


# ---------------------------------------------------------------------------------------------
# hf://
# ---------------------------------------------------------------------------------------------

class HfBackend(FsspecBackend):
    """hf://datasets/ORG/NAME[@REVISION]/path through huggingface_hub's HfFileSystem: HF_TOKEN (or the token of
    `hf auth login`), HF_ENDPOINT for a mirror. Read-only here: uploads go through the Hub's own tools.

    What is the Hub's own: HfFileSystem caches listings for the life of the filesystem, so listings and HEADs
    ask the Hub afresh (a file replaced on a branch is then seen changed); a file's version is its content id
    (the LFS sha256, else the git blob id), never its commit date, which only an expanded (slow) listing has;
    a ranged read is one GET of the file's resolve URL under our timeouts, tried once (HfFileSystemFile would
    try each 6 times itself and read 5 MB ahead of it). The Hub answers 401 alike for a missing, a private and
    a gated repo asked without a token: the error says so, and names HF_TOKEN."""
    service = "Hugging Face Hub"
    endpoint_hint = "check HF_ENDPOINT (a mirror) or the network"
    permission_hint = "a private repository needs HF_TOKEN with read access, a gated one its terms accepted too"

    def make_fs(self, options: ClientOptions) -> Any:
        from huggingface_hub import HfFileSystem
        return HfFileSystem(endpoint=os.environ.get("HF_ENDPOINT"), skip_instance_cache=True)

    def endpoint(self, url: str = "") -> str:
        return str(self.fs.endpoint)

    def object_info(self, url: str, meta: dict) -> ObjectInfo:
        lfs = meta.get("lfs") or {}
        blob = str(meta.get("blob_id") or "")
        return ObjectInfo(url, int(meta["size"]), str(lfs.get("sha256") or blob), 0.0, blob)

    def _find(self, root: str, depth: int | None) -> dict[str, dict]:
        return self.fs.find(root, maxdepth=depth, detail=True, refresh=True)

    def head(self, url: RemoteUrl) -> ObjectInfo:
        path = self.path(url)
        self.fs.invalidate_cache(path)  # else info() answers from the last listing, or misses a new file
        meta = self.fs.info(path, expand_info=True)  # unexpanded, a fresh info() has no blob id
        if meta.get("type", "file") != "file":
            raise FileNotFoundError(errno.ENOENT, "a folder, not a file", str(url))
        return self.object_info(str(url), meta)

    def bucket_exists(self, url: RemoteUrl) -> bool:
        """False for a missing repository; a missing revision or a 401 raise (translate names them)."""
        try:
            self.fs.info(url.bucket)
            return True
        except FileNotFoundError as error:
            if _hub_error(error) == "RepositoryNotFoundError" and not self.credentials_error(error, str(url)):
                return False
            raise

    def read(self, info: ObjectInfo, start: int, end: int, deadline: remote.Deadline | None = None) -> bytes:
        """One GET of the file's resolve URL, streamed so that the deadline is checked as bytes arrive."""
        import httpx2
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status
        where = self.fs.resolve_path(self.path(RemoteUrl.parse(info.url)))
        url = hf_hub_url(where.repo_id, where.path_in_repo, repo_type=where.repo_type, revision=where.revision,
                         endpoint=self.fs.endpoint)
        headers = {"Range": f"bytes={start}-{end - 1}", **build_hf_headers(token=self.fs.token)}
        timeout = httpx2.Timeout(self.options.read_timeout, connect=self.options.connect_timeout)
        with get_session().stream("GET", url, headers=headers, timeout=timeout) as response:
            hf_raise_for_status(response)
            parts = []
            for part in response.iter_bytes():
                parts.append(part)
                if deadline is not None:
                    deadline.left()
        return remote.ranged_reply(info, start, end, b"".join(parts))

    def translate(self, error: Exception, url: str, expected: ObjectInfo | None) -> Exception:
        if _hub_error(error) == "RevisionNotFoundError":
            repo, _, revision = RemoteUrl.parse(url).bucket.partition("@")
            return FileNotFoundError(f"{url}: revision {revision!r} of {repo} does not exist at {self.endpoint()}; "
                                     f"check the name after '@' (a branch, a tag or a commit)")
        return super().translate(error, url, expected)

    def credentials_error(self, error: BaseException, url: str) -> Exception | None:
        if not any(status_of(e) == 401 for e in _causes(error)):
            return None
        if os.environ.get("HF_TOKEN"):
            return PermissionError(f"{url}: {self.endpoint()} refused HF_TOKEN (401); check the token, and that it "
                                   f"may read the repository")
        return PermissionError(f"{url}: {self.endpoint()} answered 401 to a request without a token: the "
                               f"repository is private or gated, or does not exist; set HF_TOKEN to a token "
                               f"that can read it")

    def upload(self, path: str, url: RemoteUrl) -> None:
        raise PermissionError(f"{url}: writing to the Hugging Face Hub is not supported here; convert to a local "
                              f"folder and upload it with huggingface_hub (hf upload)")

    def delete(self, url: RemoteUrl) -> None:
        raise PermissionError(f"{url}: hf:// locations are read-only here")


def _hub_error(error: BaseException) -> str:
    """The name of the huggingface_hub error among `error` and its causes ("RepositoryNotFoundError", ...), or ""."""
    return next((type(e).__name__ for e in _causes(error) if type(e).__module__.startswith("huggingface_hub")), "")


# ---------------------------------------------------------------------------------------------
# http(s)://
# ---------------------------------------------------------------------------------------------

class HttpBackend(FsspecBackend):
    """http(s):// URLs through fsspec's HTTPFileSystem: read-only and never listed (remote_urls.SCHEMES); the
    server must answer HEAD with Content-Length and honour Range. Reads send If-Match with the ETag."""
    service = "HTTP"
    endpoint_hint = "check the URL's host and port and that the server is up"
    permission_hint = "the server refused the request; check the URL and any credentials it needs"
    pins_reads = False  # a server may ignore If-Match: one HEAD after each whole download checks it

    def make_fs(self, options: ClientOptions) -> Any:
        from fsspec.implementations.http import HTTPFileSystem
        return HTTPFileSystem(client_kwargs={"timeout": _aiohttp_timeout(options)}, skip_instance_cache=True)

    def endpoint(self, url: str = "") -> str:
        return "{0.scheme}://{0.bucket}".format(RemoteUrl.parse(url)) if url else "the HTTP server"

    def path(self, url: RemoteUrl) -> str:
        return redact.with_access(str(url))  # the request alone has the query string (a signature), never a message

    def head(self, url: RemoteUrl) -> ObjectInfo:
        meta = self.fs.info(self.path(url))
        if meta.get("size") is None:
            raise remote.DatasetError(str(url), "the server sent no Content-Length", "Serve it with one")
        return self.object_info(str(url), meta)

    def object_info(self, url: str, meta: dict) -> ObjectInfo:
        return ObjectInfo(url, int(meta["size"]), str(meta.get("ETag", "")), _timestamp(meta.get("Last-Modified")))

    def pin(self, info: ObjectInfo) -> dict:
        return {"headers": {"If-Match": info.etag}} if info.etag else {}

    def bucket_exists(self, url: RemoteUrl) -> bool:
        return True

    def upload(self, path: str, url: RemoteUrl) -> None:
        raise PermissionError(f"{url}: http(s):// locations are read-only; write to a local folder or a bucket")

    def delete(self, url: RemoteUrl) -> None:
        raise PermissionError(f"{url}: http(s):// locations are read-only")
