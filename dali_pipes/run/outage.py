"""Network faults of a remote source's reader: not bad samples, ridden out.

An error of a remote source's reader that is the network's (`network_fault`: DALI's native s3:// and gs://
readers' connection errors, timeouts and 5xx replies, as curl, the AWS SDK and google-cloud-cpp word them; the
ConnectionError of a Python-fed source's reads (Parquet), after the storage layer's own retries; the shard
cache raises ConnectionError itself) never starts a culprit search (recovery.py): `StoreOutage.wait` probes the
store with backoff, and the rank's pipeline is rebuilt at its last good batch; a store that stays away ends in
ConnectionError naming the endpoint and the object. Nothing is excluded, even with skip_bad. The handler is a
hook (hooks.py): each delivered batch ends a run of failed rebuilds.
"""

from __future__ import annotations

import re
import time
import warnings

from dali_pipes.data.samples import required
from dali_pipes.data.source import Source
from dali_pipes.run.hooks import BatchHook, BatchTiming, RankView
from dali_pipes.storage import remote, remote_urls
from dali_pipes.storage.remote import ClientOptions

# What DALI's S3 reader (libcurl under the AWS SDK) and GCS reader (google-cloud-cpp: "[UNAVAILABLE] Retry
# policy exhausted ... CURL error [7]=Could not connect to server") say when the store, not a sample, failed.
NETWORK_MESSAGE = re.compile(
    r"curlCode: \d+|could not connect|couldn't connect|failed to connect|connection (refused|reset|timed out)|"
    r"timeout was reached|couldn't resolve host|could not resolve host|network_connection|unable to connect|"
    r"RequestTimeout|SlowDown|ServiceUnavailable|InternalError|response code: 5\d\d|\[UNAVAILABLE\]|"
    r"\[DEADLINE_EXCEEDED\]", re.IGNORECASE)
REMOTE_URL = re.compile(r"(?:%s)://[^\s'\"]+" % "|".join(remote_urls.SCHEMES))
S3_URL = REMOTE_URL  # its earlier name


def network_fault(error: BaseException, source: Source) -> bool:
    """Whether a pipeline error of `source` is the network's: a remote source whose reader's message
    reads as a connection error, a timeout or a 5xx reply of the store, or a ConnectionError of its reads."""
    if source.remote is None:
        return False
    return isinstance(error, ConnectionError) or bool(NETWORK_MESSAGE.search(str(error)))


class StoreOutage(BatchHook):
    """Network faults of a remote source's reader, ridden out: `wait` probes the store (a HEAD of the
    object the error names, retried with backoff by storage.remote) and returns once it answers, so the
    caller rebuilds at its last good batch; it raises ConnectionError once the store stays away for
    the loader's attempts, or after that many rebuilds in a row that delivered nothing."""

    def __init__(self, options: ClientOptions | None = None) -> None:
        self.rebuilds = 0  # in a row, since the last delivered batch
        self.options = options  # the loader's retries; None: the process's default

    def wait(self, error: BaseException, source: Source) -> None:
        if not network_fault(error, source) or isinstance(error, remote.DownloadTooSlowError):
            raise error  # not the network's (a ConnectionError of a local source), or past its deadline already
        options = self.options or remote.current_options()
        sources = required(source.remote, source, "remote")  # network_fault: only a remote source's
        named = [u for u in REMOTE_URL.findall(str(error)) if any(u == o.url for o in sources)]
        url = named[0] if named else sources[0].url
        lines = [line for line in str(error).splitlines() if NETWORK_MESSAGE.search(line)] or [repr(error)]
        detail = lines[0].strip(" :")[:300]
        self.rebuilds += 1
        if self.rebuilds > options.attempts:
            reader = "the Parquet feed" if source.format.PYTHON_FED else "DALI's reader"
            raise remote.UnreachableError(
                f"{url}: {reader} failed {self.rebuilds} times in a row on network errors ({detail}), "
                f"although the store answers; {remote.backend_for(url, options).endpoint_hint}; "
                f"{remote.RETRY_HINT}") from error
        warnings.warn(f"{source.location}: a network fault, not a bad sample ({detail}); waiting for the store "
                      f"and going on from the last good batch", stacklevel=1)  # about the run, not a caller
        if self.rebuilds > 1:  # the store answered last time, yet the reader failed again: back off
            time.sleep(min(remote.BACKOFF_CAP_S, remote.BACKOFF_BASE_S * 2 ** (self.rebuilds - 2)))
        try:
            with remote.options_in_force(options):
                remote.head(url)
        except ConnectionError as unreachable:
            raise unreachable from error

    def after_batch(self, rank: RankView, timing: BatchTiming) -> None:
        self.rebuilds = 0
