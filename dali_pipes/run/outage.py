"""Network faults of an s3:// source's reader: not bad samples, ridden out.

An error of an s3:// source's reader that reads as the network's (`network_fault`: curl's and the AWS SDK's
connection errors, timeouts, 5xx replies) never starts a culprit search (recovery.py): `StoreOutage.wait`
probes the store with backoff, and the rank's pipeline is rebuilt at its last good batch; a store that
stays away ends in ConnectionError naming the endpoint and the object. Nothing is excluded, even with
skip_bad. The handler is a hook (hooks.py): each delivered batch ends a run of failed rebuilds.
"""

from __future__ import annotations

import re
import time
import warnings

from dali_pipes.data.samples import required
from dali_pipes.data.source import Source
from dali_pipes.run.hooks import BatchHook, BatchTiming, RankView
from dali_pipes.storage import object_store

# What DALI's S3 reader (libcurl under the AWS SDK) says when the store, not a sample, failed.
NETWORK_MESSAGE = re.compile(
    r"curlCode: \d+|could not connect|couldn't connect|failed to connect|connection (refused|reset|timed out)|"
    r"timeout was reached|couldn't resolve host|network_connection|unable to connect|RequestTimeout|SlowDown|"
    r"ServiceUnavailable|InternalError|response code: 5\d\d", re.IGNORECASE)
S3_URL = re.compile(r"s3://[^\s'\"]+")


def network_fault(error: BaseException, source: Source) -> bool:
    """Whether a pipeline error of `source` is the network's: an s3:// source whose reader's message
    reads as a connection error, a timeout or a 5xx reply of the store."""
    return source.remote is not None and bool(NETWORK_MESSAGE.search(str(error)))


class StoreOutage(BatchHook):
    """Network faults of an s3:// source's reader, ridden out: `wait` probes the store (a HEAD of the
    object the error names, retried with backoff by object_store) and returns once it answers, so the
    caller rebuilds at its last good batch; it raises ConnectionError once the store stays away for
    object_store's attempts, or after that many rebuilds in a row that delivered nothing."""

    def __init__(self) -> None:
        self.rebuilds = 0  # in a row, since the last delivered batch

    def wait(self, error: BaseException, source: Source) -> None:
        options = object_store.current_options()
        remote = required(source.remote, source, "remote")  # network_fault: only an s3:// source's
        named = [u for u in S3_URL.findall(str(error)) if any(u == o.url for o in remote)]
        url = named[0] if named else remote[0].url
        lines = [line for line in str(error).splitlines() if NETWORK_MESSAGE.search(line)] or [repr(error)]
        detail = lines[0].strip(" :")[:300]
        self.rebuilds += 1
        if self.rebuilds > options.attempts:
            raise object_store.UnreachableError(
                f"{url}: DALI's S3 reader failed {self.rebuilds} times in a row on network errors ({detail}), "
                f"although the store answers; {object_store.ENDPOINT_HINT}; {object_store.RETRY_HINT}") from error
        warnings.warn(f"{source.location}: a network fault, not a bad sample ({detail}); waiting for the store "
                      f"and going on from the last good batch", stacklevel=1)  # about the run, not a caller
        if self.rebuilds > 1:  # the store answered last time, yet the reader failed again: back off
            time.sleep(min(object_store.BACKOFF_CAP_S, object_store.BACKOFF_BASE_S * 2 ** (self.rebuilds - 2)))
        try:
            object_store.head(url)
        except ConnectionError as unreachable:
            raise unreachable from error

    def after_batch(self, rank: RankView, timing: BatchTiming) -> None:
        self.rebuilds = 0
