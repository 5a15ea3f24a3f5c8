"""Secrets kept out of every text the library writes: messages, log lines, loader states, cache file names.

What identifies an object and what grants access to it are two things. An http(s) URL's query string (a
presigned S3 URL's X-Amz-Signature, an Azure SAS, a `token=`) and its user info grant access: `identity(url)`
takes them off and keeps them here, in this process only, and the URL without them is the name every other
module sees and writes (RemoteUrl, ObjectInfo.url, a state's fingerprint, a shard cache's file). Only the
request itself asks for them back (`with_access`), so a state taken under one signature resumes under a
fresh one: the caller passes the URLs again, and the same object is the same data. An object is named by its
path alone: two URLs that differ only in their query string are one object.

What comes back from an SDK (an error's text, an endpoint holding a SAS) is scrubbed before it is raised or
logged: `scrub` masks every http(s) URL's query and user info, and the values of the credential variables
(SECRET_VARIABLES, and the keys inside AZURE_STORAGE_CONNECTION_STRING).

A leaf: imports nothing of ours.
"""

from __future__ import annotations

import os
import re
import threading
import urllib.parse

MASK = "<redacted>"
# Variables whose values grant access; a value shorter than MIN_SECRET is not masked (it would mask words)
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY",
                    "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CLIENT_SECRET", "AZURE_STORAGE_CONNECTION_STRING",
                    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
CONNECTION_STRING_KEYS = ("AccountKey", "SharedAccessSignature", "SharedAccessKey")
MIN_SECRET = 8
# An http(s) URL in a text: its user info, the rest, its query (not one masked already: scrub is idempotent)
_HTTP_URL = re.compile(r"(?P<scheme>https?://)(?P<user>[^/\s'\"<>@]*@)?(?P<rest>[^\s'\"<>?#]*)"
                       r"(?P<query>\?(?!<)[^\s'\"<>#]*)?", re.IGNORECASE)

_lock = threading.Lock()
_access: dict[str, tuple[str, str]] = {}  # identity -> (user info with its "@", query with its "?")


def split(url: str) -> tuple[str, str, str]:
    """(identity, user info, query) of an http(s) URL; any other URL is all identity ("s3://b/a?b": a glob)."""
    if not url.lower().startswith(("http://", "https://")):
        return url, "", ""
    scheme, rest = url.split("://", 1)
    rest, mark, query = rest.partition("?")
    host, slash, path = rest.partition("/")
    user, at, host = host.rpartition("@")
    # scheme and host are case-blind: HTTPS://Host/x and https://host/x are one object, kept once
    return f"{scheme.lower()}://{host.lower()}{slash}{path}", user + at, mark + query


def identity(url: str) -> str:
    """`url` without what grants access (kept here for `with_access`); other URLs unchanged. A URL with a query
    string or user info replaces the one kept for its identity (a fresh signature wins)."""
    name, user, query = split(url)
    if user or query:
        with _lock:
            _access[name] = (user, query)
    return name


def with_access(name: str) -> str:
    """The URL to request for an identity: its user info and query string put back, as last given."""
    user, query = _access.get(name, ("", ""))
    if not (user or query):
        return name
    scheme, rest = name.split("://", 1)
    return f"{scheme}://{user}{rest}{query}"


def kept() -> dict[str, tuple[str, str]]:
    """What is kept aside, for a spawned worker process (`keep` there): its requests need it too."""
    with _lock:
        return dict(_access)


def keep(access: dict[str, tuple[str, str]]) -> None:
    with _lock:
        _access.update(access)


def redacted_url(url: str) -> str:
    """An endpoint fit to show (an Azure account URL made from a SAS connection string): no query, no user info."""
    return split(url)[0]


def _secrets() -> list[str]:
    """Every value `scrub` masks, longest first (a key inside a connection string is masked as itself)."""
    found = [os.environ.get(name, "") for name in SECRET_VARIABLES]
    connection = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
    for part in connection.split(";"):
        key, _, value = part.partition("=")
        if key.strip() in CONNECTION_STRING_KEYS:
            found += [value, urllib.parse.unquote(value)]
    return sorted({s for s in found if len(s) >= MIN_SECRET}, key=len, reverse=True)


def _mask_url(match: re.Match) -> str:
    return (match["scheme"] + (MASK + "@" if match["user"] else "") + match["rest"] +
            ("?" + MASK if match["query"] else ""))


def scrub(text: str) -> str:
    """`text` with every http(s) URL's query string and user info masked, and every known secret value."""
    text = _HTTP_URL.sub(_mask_url, text)
    for secret in _secrets():
        text = text.replace(secret, MASK)
    return text


def _texts(error: BaseException, depth: int = 8) -> list[str]:
    """The text of an error and of those it was raised from (a traceback prints them all)."""
    out: list[str] = []
    seen: BaseException | None = error
    for _ in range(depth):
        if seen is None:
            break
        out.append(str(seen))
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return out


def holds_secret(error: BaseException) -> bool:
    """Whether an error, or one it was raised from, names a secret (an SDK's text with a signed URL in it)."""
    return any(scrub(text) != text for text in _texts(error))


def clean(error: BaseException) -> BaseException:
    """`error` when neither it nor its causes name a secret; cut from its causes when they alone do (a traceback
    would print them); else an error of its type (or the nearest base type that can be made from one message, so
    that `except ConnectionError` still catches it) with the scrubbed text."""
    if not holds_secret(error):
        return error
    text = scrub(str(error))
    if text == str(error):
        error.__cause__, error.__suppress_context__ = None, True
        return error
    for kind in type(error).__mro__:
        try:
            fresh = kind(text if kind is type(error) else f"{type(error).__name__}: {text}")
        except Exception:
            continue
        if str(fresh) == scrub(str(fresh)):  # not a type that formats its arguments its own way
            fresh.__suppress_context__ = True
            return fresh
    raise AssertionError("BaseException takes one message")
