"""Real object stores on 127.0.0.1 for the storage tests, one per scheme, started by the tests themselves:
gcp-storage-emulator for gs://, Azurite (npx azurite-blob; skipped with the reason where Node is absent)
for az://, a Range-capable HTTP file server for http://, a Hub mirror (store_servers.HubMirror: the Hub's
API routes HfFileSystem uses) for hf://. Test modules load the fixtures as a plugin:

    pytest_plugins = ["store_servers"]

    def test_something(store):          # parametrized over "gs", "az", "http", "hf"
        url = store.put("train/a.tfrecord", b"...")

Each fixture points its SDK's chain at the server (STORAGE_EMULATOR_HOST; AZURE_STORAGE_CONNECTION_STRING;
HF_ENDPOINT, with HF_HOME in the test's folder so no stored token is read) with every other variable of that
chain cleared, so no test can reach another address.
"""

from __future__ import annotations

import itertools
import os
import urllib.parse
from dataclasses import dataclass, field

import pytest

from dali_pipes_bench.servers.store_servers import Azurite, GcsEmulator, HttpFileServer, HubMirror, azurite_missing

_numbers = itertools.count()
CLEARED = ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "AZURE_STORAGE_ACCOUNT_NAME",
           "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CLIENT_ID",
           "AZURE_STORAGE_CLIENT_SECRET", "AZURE_STORAGE_TENANT_ID", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy",
           "https_proxy", "HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE")
# What remote.prepare_native sets for DALI's own gs:// reader, where unset
SET_BY_THE_LIBRARY = ("DALI_GCS_ENDPOINT_URL", "DALI_GCS_ANONYMOUS", "DALI_GCS_REQUEST_TIMEOUT_SEC")


@dataclass
class Store:
    """One empty bucket (container, folder of the HTTP server, dataset repo of the Hub mirror) of one scheme, and
    how to fill it."""
    scheme: str
    bucket: str
    endpoint: str
    admin: object = field(repr=False, default=None)  # an fsspec filesystem made for the test, or a folder

    def url(self, key: str = "") -> str:
        if self.scheme == "http":
            return f"{self.endpoint}/{self.bucket}/{key}"
        return f"{self.scheme}://{self.bucket}/{key}"

    def file(self, key: str, revision: str = "main") -> str:
        """Where a served folder (http, hf: of that revision) keeps `key`."""
        if self.scheme == "hf":
            return os.path.join(str(self.admin), *self.bucket.split("/"), urllib.parse.quote(revision, safe=""), key)
        return os.path.join(str(self.admin), self.bucket, key)

    def put(self, key: str, data: bytes, revision: str = "main") -> str:
        """Store `data` at `key` (of `revision`, on the Hub mirror); its URL (naming a revision other than main)."""
        if self.scheme in ("http", "hf"):
            path = self.file(key, revision)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        else:
            self.admin.pipe_file(f"{self.bucket}/{key}", data)
        return self.url(key) if revision == "main" else f"{self.scheme}://{self.bucket}@{revision}/{key}"

    def delete(self, key: str) -> None:
        if self.scheme in ("http", "hf"):
            os.remove(self.file(key))
        else:
            self.admin.rm_file(f"{self.bucket}/{key}")


def _clear(monkeypatch: pytest.MonkeyPatch) -> None:
    from s3_server import keep_s3_options
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    for name in SET_BY_THE_LIBRARY:  # unset now and again after the test (monkeypatch restores in reverse)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # gcsfs/google-auth: never ask a metadata server
    keep_s3_options(monkeypatch)


@pytest.fixture(scope="session")
def gcs_endpoint():
    pytest.importorskip("gcsfs", reason="gs:// needs gcsfs: pip install '.[gcs]' (from the dali_pipes checkout)")
    with GcsEmulator() as server:
        yield server.endpoint


@pytest.fixture
def gcs(gcs_endpoint, monkeypatch) -> Store:
    """A fresh bucket on the GCS emulator; STORAGE_EMULATOR_HOST points there."""
    from gcsfs.core import GCSFileSystem
    _clear(monkeypatch)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_endpoint)
    admin = GCSFileSystem(token="anon", skip_instance_cache=True)
    bucket = f"bucket-{os.getpid()}-{next(_numbers)}"
    admin.mkdir(bucket)
    return Store("gs", bucket, gcs_endpoint, admin)


@pytest.fixture(scope="session")
def azurite_server():
    pytest.importorskip("adlfs", reason="az:// needs adlfs: pip install '.[azure]' (from the dali_pipes checkout)")
    reason = azurite_missing()
    if reason:
        pytest.skip(reason)
    with Azurite() as server:
        yield server


@pytest.fixture
def azure(azurite_server, monkeypatch) -> Store:
    """A fresh container on Azurite; AZURE_STORAGE_CONNECTION_STRING points there."""
    from adlfs import AzureBlobFileSystem
    _clear(monkeypatch)
    connection = azurite_server.connection_string()
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
    admin = AzureBlobFileSystem(connection_string=connection, skip_instance_cache=True)
    container = f"container-{os.getpid()}-{next(_numbers)}"
    admin.mkdir(container)
    return Store("az", container, azurite_server.endpoint, admin)


@pytest.fixture(scope="session")
def http_root(tmp_path_factory):
    return tmp_path_factory.mktemp("http-root")


@pytest.fixture(scope="session")
def http_endpoint(http_root):
    with HttpFileServer(str(http_root)) as server:
        yield server.endpoint


@pytest.fixture
def http_store(http_endpoint, http_root, monkeypatch) -> Store:
    """A fresh folder served over HTTP (never listed: URLs and lists of them)."""
    _clear(monkeypatch)
    return Store("http", f"folder-{os.getpid()}-{next(_numbers)}", http_endpoint, http_root)


@pytest.fixture(scope="session")
def hub_root(tmp_path_factory):
    return tmp_path_factory.mktemp("hub-root")


@pytest.fixture(scope="session")
def hub_endpoint(hub_root):
    pytest.importorskip("huggingface_hub", reason="hf:// needs huggingface_hub: "
                        "pip install '.[hf]' (from the dali_pipes checkout)")
    with HubMirror(str(hub_root), page_size=5) as server:  # listings of more than 5 entries come in pages
        yield server.endpoint


def point_hf_at(monkeypatch: pytest.MonkeyPatch, endpoint: str, home: str) -> None:
    """HF_ENDPOINT at a mirror, HF_HOME in the test's folder (no stored token), no telemetry."""
    _clear(monkeypatch)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", home)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")


@pytest.fixture
def hub(hub_endpoint, hub_root, monkeypatch, tmp_path) -> Store:
    """A fresh dataset repo (datasets/org/repo-N, revision main) on the public Hub mirror; HF_ENDPOINT points there."""
    point_hf_at(monkeypatch, hub_endpoint, str(tmp_path / "hf-home"))
    repo = f"datasets/org/repo-{os.getpid()}-{next(_numbers)}"
    os.makedirs(os.path.join(str(hub_root), *repo.split("/"), "main"))
    return Store("hf", repo, hub_endpoint, hub_root)


SCHEME_FIXTURES = {"gs": "gcs", "az": "azure", "http": "http_store", "hf": "hub"}


@pytest.fixture(params=list(SCHEME_FIXTURES))
def store(request) -> Store:
    """A fresh bucket of each scheme in turn."""
    return request.getfixturevalue(SCHEME_FIXTURES[request.param])
