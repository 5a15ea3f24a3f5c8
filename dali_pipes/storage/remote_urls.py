"""The names of remote objects: the table of schemes (which backend, which extra, what each can do), a URL parsed
into scheme, bucket and key, the identity every message and cache key uses (an http URL's secrets aside:
redact.py), globs with local semantics, and ObjectInfo, one object as listed. Nothing here talks to a store
(remote.py and transfer.py do)."""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import posixpath
from dataclasses import dataclass

from dali_pipes.storage import redact

WILDCARDS = "*?["


@dataclass(frozen=True)
class Scheme:
    """One URL scheme: the module and class of its backend, the extra that installs it, and what it can do."""
    module: str
    backend: str
    extra: str
    listing: bool = True  # False: the server cannot list (http): locations are URLs or lists of them
    native: bool = False  # DALI 2.4 reads it itself (remote_feed="native")
    writable: bool = True  # False: convert cannot write there (hf: the Hub's own tools; http)


# The table of schemes; a new one costs a Backend class and one line here. Loaded by name, when first used,
# so that `pip install .` imports none of the SDKs.
SCHEMES = {
    "s3": Scheme("dali_pipes.storage.object_store", "S3Backend", "s3", native=True),
    "gs": Scheme("dali_pipes.storage.fs", "GcsBackend", "gcs", native=True),
    "az": Scheme("dali_pipes.storage.fs", "AzureBackend", "azure"),
    "abfs": Scheme("dali_pipes.storage.fs", "AzureBackend", "azure"),
    "hf": Scheme("dali_pipes.storage.fs", "HfBackend", "hf", writable=False),
    "http": Scheme("dali_pipes.storage.fs", "HttpBackend", "http", listing=False, writable=False),
    "https": Scheme("dali_pipes.storage.fs", "HttpBackend", "http", listing=False, writable=False),
}
HF_REPO_TYPES = ("datasets", "spaces", "models")


def scheme_of(location: object) -> str | None:
    """"s3", "gs", ... for a URL of a known scheme (str or RemoteUrl); None for anything else."""
    if isinstance(location, RemoteUrl):
        return location.scheme
    if not isinstance(location, str) or "://" not in location:
        return None
    scheme = location.split("://", 1)[0].lower()
    return scheme if scheme in SCHEMES else None


def is_remote(location: object) -> bool:
    """True for URLs of a known scheme (str or RemoteUrl); local paths, PathLikes and lists are not remote."""
    return scheme_of(location) is not None


@dataclass(frozen=True)
class RemoteUrl:
    """A parsed URL: scheme, bucket (an S3/GCS bucket, an Azure container, a Hub repo "datasets/ORG/NAME"
    with its revision if one is named, "datasets/ORG/NAME@v1.0", an HTTP host) and key (may be "" or end in
    "/": a prefix). An http(s) URL's query string and user info grant access, they do not name the object: they
    are kept aside (redact.identity) and only its request has them, so a RemoteUrl and its str hold no secret."""
    scheme: str
    bucket: str
    key: str = ""

    @classmethod
    def parse(cls, url: str) -> "RemoteUrl":
        """Split a URL; ValueError names it when it is none of the schemes or lacks a bucket."""
        scheme = scheme_of(url)
        if scheme is None:
            raise ValueError(f"{redact.identity(str(url))!r}: not a remote URL; expected one of "
                             f"{', '.join(s + '://' for s in SCHEMES)} followed by bucket/key")
        rest = redact.identity(str(url)).split("://", 1)[1]
        parts = rest.split("/")
        width = 3 if scheme == "hf" and parts[0] in HF_REPO_TYPES else 2 if scheme == "hf" else 1
        if scheme == "hf" and parts[width - 1].endswith("@refs") and len(parts) > width + 1:
            width += 2  # a Hub revision with slashes: NAME@refs/pr/1, NAME@refs/convert/parquet
        bucket, key = "/".join(parts[:width]), "/".join(parts[width:])
        if not bucket or not all(parts[:width]):
            raise ValueError(f"{redact.identity(str(url))!r}: no bucket name; expected "
                             f"{scheme}://{_bucket_word(scheme)}/key")
        return cls(scheme, bucket, key)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}"

    def join(self, *parts: str) -> "RemoteUrl":
        """The URL of `parts` below this one ("a/" + "b" -> "a/b"; no "..", keys are not paths)."""
        return dataclasses.replace(self, key=posixpath.join(self.key, *parts) if self.key else posixpath.join(*parts))


def _bucket_word(scheme: str) -> str:
    return {"hf": "datasets/ORG/NAME", "http": "host", "https": "host", "az": "container",
            "abfs": "container"}.get(scheme, "bucket")


def bucket_noun(scheme: str) -> str:
    return {"hf": "repository", "http": "host", "https": "host", "az": "container", "abfs": "container"}.get(
        scheme, "bucket")


def identity(url: str) -> str:
    """The name of `url` in every message, state and cache key: an http(s) URL without its query string and user
    info (kept aside for its requests: redact.py); any other location unchanged."""
    return redact.identity(url)


def join(base: str, relative: str) -> str:
    """`relative` resolved against the prefix `base` (a file list's entries are relative to its folder)."""
    return str(RemoteUrl.parse(base).join(relative))


def dirname(url: str) -> str:
    """The prefix that holds `url`, with a trailing "/" (s3://b/x/list.txt -> s3://b/x/)."""
    parsed = RemoteUrl.parse(url)
    folder = posixpath.dirname(parsed.key)
    return str(dataclasses.replace(parsed, key=folder + "/" if folder else ""))


def relative_to(url: str, base: str) -> str:
    """The key of `url` relative to the prefix `base`; ValueError when it is not below it."""
    target, prefix = RemoteUrl.parse(url), RemoteUrl.parse(base)
    start = prefix.key if not prefix.key or prefix.key.endswith("/") else prefix.key + "/"
    if (target.scheme, target.bucket) != (prefix.scheme, prefix.bucket) or not target.key.startswith(start):
        raise ValueError(f"{url} is not below {base}")
    return target.key[len(start):]


def basename(url: str) -> str:
    """The last segment of a URL's key (the name a downloaded copy keeps)."""
    return posixpath.basename(RemoteUrl.parse(url).key)


@dataclass(frozen=True)
class ObjectInfo:
    """One object as listed: its URL, size in bytes, ETag (as the store sends it, S3's with quotes),
    last-modified time (POSIX seconds) and generation (GCS's object generation, an Azure version id, a
    Hub file's blob id; "" where the store has none). Two infos are equal only if the object did not change."""
    url: str
    size: int
    etag: str
    last_modified: float
    generation: str = ""

    @property
    def version(self) -> str:
        """A short key of the fields: a changed object gets a new one, so caches of shards and indexes
        keyed by it are never read stale."""
        text = f"{self.url}\0{self.size}\0{self.etag}\0{self.last_modified!r}"
        text += f"\0{self.generation}" if self.generation else ""  # S3 keys stay as they were
        return hashlib.sha1(text.encode()).hexdigest()[:20]


def has_wildcard(text: str) -> bool:
    return any(c in text for c in WILDCARDS)


def glob_matches(key: str, pattern: str) -> bool:
    """Local-glob semantics on keys: a wildcard never crosses "/" (train-* does not match train-x/y)."""
    keys, patterns = key.split("/"), pattern.split("/")
    return len(keys) == len(patterns) and all(fnmatch.fnmatchcase(k, p) for k, p in zip(keys, patterns))
