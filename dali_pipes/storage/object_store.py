"""s3:// on boto3: the S3 backend of the shared layer (remote.py).

Why boto3 and not s3fs: s3fs reaches S3 through aiobotocore, which pins a botocore older than the boto3
that moto and this package use (installing it would downgrade botocore under boto3). So S3 keeps one
boto3 client per process and options, and only what is S3's own lives here: the client made from the AWS
chain (credentials, region, profile and endpoint, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3, come from the
environment and ~/.aws files, never from here), ListObjectsV2 pages, If-Match reads, uploads, and
botocore's errors told apart. Listing with globs, retries, checked downloads and the clear errors are
remote.py's, shared with every scheme (import them from there: the names re-exported here until 0.3 are gone).
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import threading
import time
from typing import Iterator

from dali_pipes.errors import install_hint
from dali_pipes.storage import remote, remote_urls
from dali_pipes.storage.remote import ClientOptions, changed_error, current_options, truncated_error
from dali_pipes.storage.remote_urls import ObjectInfo

SCHEME = "s3://"
ENDPOINT_HINT = "check AWS_ENDPOINT_URL (or endpoint_url in the AWS config) and that the server is up"
RETRIED_STATUSES = (500, 502, 503, 504)  # a store restarting or throttling: worth another try
RETRIED_CODES = ("SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "Throttling")


class S3Url(remote_urls.RemoteUrl):
    """A parsed s3://bucket/key URL; `key` may be "" (the bucket) or end in "/" (a prefix)."""

    def __init__(self, bucket: str, key: str = "", scheme: str = "s3") -> None:
        super().__init__(scheme, bucket, key)

    @classmethod
    def parse(cls, url: str) -> "S3Url":
        """Split "s3://bucket/key"; ValueError names the URL when it is not one."""
        if not is_remote(url):
            raise ValueError(f"{url!r}: not an S3 URL; expected s3://bucket/key")
        parsed = remote_urls.RemoteUrl.parse(url)
        return cls(parsed.bucket, parsed.key)


def is_remote(location: object) -> bool:
    """True for s3:// URLs (str or a parsed s3 URL); local paths, PathLikes, lists and other schemes are not."""
    return remote_urls.scheme_of(location) == "s3"


# ---------------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------------

# Variables that select the endpoint or identity: a client made under other values is not reused.
_CHAIN_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
                    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                    "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


def s3_client(options: ClientOptions | None = None):
    """The process's boto3 S3 client for these options (default: this thread's) and the current AWS environment.

    boto3 clients are thread-safe but not fork-safe and slow to make (~50 ms): one per
    (process, options, AWS variables)."""
    environment = tuple(os.environ.get(name) for name in _CHAIN_VARIABLES)
    return _cached_client(os.getpid(), options or current_options(), environment)


@functools.lru_cache(maxsize=8)
def _cached_client(pid: int, options: ClientOptions, environment: tuple):
    try:
        import boto3
        from botocore.config import Config
    except ImportError as e:
        raise remote.MissingBackendError(f"s3:// locations need boto3: {install_hint('s3')}") from e
    config = Config(connect_timeout=options.connect_timeout, read_timeout=options.read_timeout,
                    retries={"total_max_attempts": 1, "mode": "standard"},  # remote.retrying retries
                    max_pool_connections=options.max_pool_connections)
    # A fresh session per client: the default session caches credentials across env changes.
    return boto3.session.Session().client("s3", config=config)


def endpoint_of(client) -> str:
    return client.meta.endpoint_url


# ---------------------------------------------------------------------------------------------
# Errors: botocore's exceptions -> built-in types whose message names the object, endpoint, fix
# ---------------------------------------------------------------------------------------------

def _error_code(error: Exception) -> tuple[str, int]:
    response = getattr(error, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    return code, int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def translate_error(error: Exception, url: str, client, expected: ObjectInfo | None = None) -> Exception:
    """The clear exception for a botocore failure on `url`; the original error itself when it is
    none of the known kinds (the caller raises the result `from error`)."""
    from boto3.exceptions import S3UploadFailedError
    from botocore import exceptions as bx
    if isinstance(error, S3UploadFailedError) and error.__context__ is not None:
        error = error.__context__  # s3transfer wraps the ClientError of a failed upload
    endpoint = endpoint_of(client)
    if isinstance(error, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return PermissionError(
            f"{url}: no AWS credentials found for endpoint {endpoint}. Set AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with a profile in ~/.aws/credentials")
    if isinstance(error, (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError,
                          bx.ConnectionClosedError)):
        return ConnectionError(f"{url}: cannot reach the S3 endpoint {endpoint} ({error}); {ENDPOINT_HINT}")
    code, status = _error_code(error)
    bucket = S3Url.parse(url).bucket
    if code == "NoSuchBucket":
        return FileNotFoundError(f"{url}: bucket {bucket!r} does not exist at {endpoint}; check the bucket "
                                 f"name, and AWS_ENDPOINT_URL / the region if it exists elsewhere")
    if code in ("NoSuchKey", "404") or status == 404:
        if expected is not None:
            return remote.disappeared_error(url, expected)
        return FileNotFoundError(f"{url}: no such object at {endpoint}; check the key")
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled") \
            or status == 403:
        return PermissionError(f"{url}: access denied by {endpoint} ({code or status}); the credentials in use "
                               f"need s3:ListBucket on bucket {bucket!r} and s3:GetObject on its objects")
    if code == "PreconditionFailed" or status == 412:
        return changed_error(url, expected, "its ETag no longer matches (If-Match failed)")
    return error


def retryable(error: BaseException) -> bool:
    """A network fault or a store that is restarting or throttling (5xx): another try may succeed.
    Missing objects, denied access and changed objects are not: they would not come back."""
    if isinstance(error, ConnectionError):
        return True
    from botocore.exceptions import ClientError
    if isinstance(error, ClientError):
        code, status = _error_code(error)
        return status in RETRIED_STATUSES or code in RETRIED_CODES
    return False


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------

def _info(bucket: str, key: str, size: int, etag: str, modified) -> ObjectInfo:
    return ObjectInfo(f"{SCHEME}{bucket}/{key}", int(size), str(etag), float(modified.timestamp()))


class S3Backend:
    """remote.Backend for s3:// over one boto3 client."""
    service = "S3"
    endpoint_hint = ENDPOINT_HINT
    pins_reads = True  # If-Match on every GET

    def __init__(self, options: ClientOptions) -> None:
        self.client = s3_client(options)

    def endpoint(self, url: str = "") -> str:
        return endpoint_of(self.client)

    def list_prefix(self, bucket: str, prefix: str, url: str, page_size: int) -> Iterator[ObjectInfo]:
        """Every object under `prefix`, recursively, in key order; each page is one request, retried on its own."""
        token: dict = {}
        while True:
            page = remote.retrying(url, self, functools.partial(  # this page's call, its token bound now
                self.client.list_objects_v2, Bucket=bucket, Prefix=prefix, MaxKeys=page_size, **token))
            for item in page.get("Contents", []):
                if not item["Key"].endswith("/"):  # "folder" marker objects made by consoles
                    yield _info(bucket, item["Key"], item["Size"], item["ETag"], item["LastModified"])
            if not page.get("IsTruncated"):
                return
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def head(self, url: remote_urls.RemoteUrl) -> ObjectInfo:
        reply = self.client.head_object(Bucket=url.bucket, Key=url.key)
        return _info(url.bucket, url.key, reply["ContentLength"], reply["ETag"], reply["LastModified"])

    def bucket_exists(self, url: remote_urls.RemoteUrl) -> bool:
        try:
            self.client.head_bucket(Bucket=url.bucket)
            return True
        except Exception as error:
            if _error_code(error)[1] == 404 or _error_code(error)[0] in ("NoSuchBucket", "404"):
                return False
            raise

    def read(self, info: ObjectInfo, start: int, end: int, deadline: remote.Deadline | None = None) -> bytes:
        if deadline is not None:
            deadline.left()  # boto3 has no overall timeout per request: checked before it, the body cut at it
        url = S3Url.parse(info.url)
        reply = self.client.get_object(Bucket=url.bucket, Key=url.key, IfMatch=info.etag,
                                       Range=f"bytes={start}-{end - 1}")
        with cut_at(deadline, reply["Body"]):
            return reply["Body"].read()

    def stream(self, info: ObjectInfo, chunk_bytes: int, deadline: remote.Deadline) -> Iterator[bytes]:
        """One GET (If-Match) for the whole body, read in chunks; a body cut short is TruncatedDownloadError."""
        from botocore.exceptions import BotoCoreError, IncompleteReadError, ResponseStreamingError
        url = S3Url.parse(info.url)
        reply = remote.retrying(info.url, self, lambda: self.client.get_object(Bucket=url.bucket, Key=url.key,
                                                                               IfMatch=info.etag), info)
        if reply.get("ETag", info.etag) != info.etag:  # stores that ignore If-Match
            raise changed_error(info.url, info, f"its ETag is now {reply['ETag']}")
        body, got = reply["Body"], 0
        try:
            with cut_at(deadline, body):
                for chunk in body.iter_chunks(chunk_bytes):
                    got += len(chunk)
                    yield chunk
        except (IncompleteReadError, ResponseStreamingError) as error:
            if deadline.passed():  # the body was cut at the deadline
                raise deadline.error() from None
            raise truncated_error(info, got) from error
        except BotoCoreError as error:  # a body that stalls past the read timeout: ConnectionError
            raise self.translate(error, info.url, info) from error
        finally:
            body.close()

    def upload(self, path: str, url: remote_urls.RemoteUrl) -> None:
        self.client.upload_file(path, url.bucket, url.key)

    def delete(self, url: remote_urls.RemoteUrl) -> None:
        self.client.delete_object(Bucket=url.bucket, Key=url.key)

    def translate(self, error: Exception, url: str, expected: ObjectInfo | None) -> Exception:
        return translate_error(error, url, self.client, expected)

    def retryable(self, error: Exception) -> bool:
        return retryable(error)


@contextlib.contextmanager
def cut_at(deadline: remote.Deadline | None, body) -> Iterator[None]:
    """Shut the connection of a boto3 reply's `body` when `deadline` passes, so that a read blocked on a store that
    drips bytes returns. boto3 has no overall timeout per request, and its read timeout is per socket read: a store
    sending a byte a second never trips it. Shutting the socket (not closing it: a close from another thread does not
    wake a blocked recv) ends the read with an incomplete-read error, which the caller turns into the deadline's."""
    if deadline is None:
        yield
        return

    def cut() -> None:
        sock = reply_socket(body)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
    timer = threading.Timer(max(0.0, deadline.until - time.monotonic()), cut)  # no socket found: checked after
    timer.daemon = True
    timer.start()
    try:
        yield
    except Exception:
        if deadline.passed():
            raise deadline.error() from None
        raise
    finally:
        timer.cancel()


def reply_socket(body) -> socket.socket | None:
    """The socket a boto3 reply's body is read from, through private attributes (botocore 1.x's StreamingBody over
    urllib3 2's HTTPResponse over http.client's): the connection's, or, once http.client has let go of it (a reply
    that closes the connection), the one its response reads. None where the chain has changed."""
    raw = getattr(body, "_raw_stream", None)
    sock = getattr(getattr(raw, "connection", None), "sock", None)
    if sock is None:
        reader = getattr(getattr(getattr(raw, "_fp", None), "fp", None), "raw", None)  # socket.SocketIO
        sock = getattr(reader, "_sock", None)
    return sock if isinstance(sock, socket.socket) else None
