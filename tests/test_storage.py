"""The shared storage layer (storage/remote.py, storage/fs.py) against real servers on 127.0.0.1, one per
scheme: gcp-storage-emulator (gs://), Azurite (az://), a Range-capable HTTP file server (http://), a Hub
mirror (hf://: store_servers.HubMirror answers the Hub API routes huggingface_hub's HfFileSystem uses, so
the real HfFileSystem runs against it); S3 is tests/test_object_store.py's (moto). Faults a healthy server
does not make (503s, slow replies) come from the latency proxy in front of a server."""

import os
import subprocess
import sys

import pytest

from dali_pipes import DaliLoader, DatasetError
from dali_pipes.data.formats import tfrecord
from dali_pipes.storage import remote, remote_urls, transfer
from dali_pipes.storage.remote_urls import ObjectInfo, RemoteUrl
from dali_pipes_bench.servers.latency_proxy import Fault, LatencyProxy

from conftest import jpeg_bytes
from s3_server import closed_endpoint

pytest_plugins = ["store_servers", "s3_server"]  # fixtures: store (gs, az, http), gcs, azure, http_store; s3, proxy

KW = dict(image_size=16, device="cpu", num_threads=1, val_padding="label")  # val: exactly once, -1 padding


def keys(infos: list[ObjectInfo]) -> list[str]:
    return [RemoteUrl.parse(info.url).key for info in infos]


# ---------------------------------------------------------------------------------------------
# URLs and the table of schemes
# ---------------------------------------------------------------------------------------------

def test_urls_of_every_scheme_parse_join_and_relate():
    assert RemoteUrl.parse("gs://b/a/x.tfrecord") == RemoteUrl("gs", "b", "a/x.tfrecord")
    assert RemoteUrl.parse("az://cont/k") == RemoteUrl("az", "cont", "k")
    assert RemoteUrl.parse("abfs://cont/k").bucket == "cont"
    assert RemoteUrl.parse("hf://datasets/org/name/data/train-0.parquet") == \
        RemoteUrl("hf", "datasets/org/name", "data/train-0.parquet")
    assert RemoteUrl.parse("http://127.0.0.1:8000/d/list.txt") == RemoteUrl("http", "127.0.0.1:8000", "d/list.txt")
    assert remote_urls.join("gs://b/data/", "cat/1.jpg") == "gs://b/data/cat/1.jpg"
    assert remote_urls.dirname("https://h/d/list.txt") == "https://h/d/"
    assert remote_urls.relative_to("az://c/data/cat/1.jpg", "az://c/data") == "cat/1.jpg"
    assert all(remote_urls.is_remote(u) for u in ("s3://b/k", "gs://b/k", "az://c/k", "hf://datasets/o/n", "https://h/x"))
    assert not remote_urls.is_remote("/data/gs:/x") and not remote_urls.is_remote(["gs://b/k"])
    with pytest.raises(ValueError, match="no bucket"):
        RemoteUrl.parse("gs:///key")
    with pytest.raises(ValueError, match="not below"):
        remote_urls.relative_to("gs://b/data/1.jpg", "s3://b/data/")


def test_a_plain_import_loads_no_storage_sdk():
    code = ("import sys, dali_pipes; from dali_pipes import DaliLoader; from dali_pipes.storage import remote, fs\n"
            "sdks = ('boto3', 'gcsfs', 'adlfs', 'azure', 'huggingface_hub', 'google.cloud', 's3fs')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in sdks or m in sdks))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.stdout.strip() == "[]"


def test_a_url_whose_backend_is_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if not installed: importing it raises ImportError
    monkeypatch.setitem(sys.modules, "gcsfs.core", None)
    remote._cached_backend.cache_clear()
    with pytest.raises(ImportError, match=r"pip install '\.\[gcs\]' \(from the dali_pipes checkout\)"):
        remote.list_objects("gs://bucket/train/")
    remote._cached_backend.cache_clear()


# ---------------------------------------------------------------------------------------------
# Listing, reads, downloads: the same behaviour on every scheme
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_lists_a_prefix_recursively_and_globs_within_one_segment(scheme, request):
    store = request.getfixturevalue({"gs": "gcs", "az": "azure"}[scheme])
    for key in ("d/b.tfrecord", "d/a.tfrecord", "d/sub/c.tfrecord", "other/x", "d-sibling/y",
                "im/train-00000-of-00002", "im/train-00001-of-00002", "im/train-x/train-1-of-2"):
        store.put(key, key.encode())
    found = remote.list_objects(store.url("d/"))
    assert keys(found) == ["d/a.tfrecord", "d/b.tfrecord", "d/sub/c.tfrecord"]
    assert [o.size for o in found] == [len(b"d/a.tfrecord"), len(b"d/b.tfrecord"), len(b"d/sub/c.tfrecord")]
    assert found[0] == remote.head(found[0].url) and found[0].etag
    assert keys(remote.list_objects(store.url("d"))) == keys(found)  # no slash: still the folder
    assert keys(remote.list_objects(store.url("d/a.tfrecord"))) == ["d/a.tfrecord"]
    assert keys(remote.list_objects(store.url("im/train-*-of-00002"))) == \
        ["im/train-00000-of-00002", "im/train-00001-of-00002"]
    assert keys(remote.list_objects(store.url("im/*/train-?-of-2"))) == ["im/train-x/train-1-of-2"]
    with pytest.raises(FileNotFoundError, match="no objects match"):
        remote.list_objects(store.url("val/"))


def test_http_is_read_by_url_never_listed(http_store):
    url = http_store.put("d/a.bin", b"0123456789")
    (info,) = remote.list_objects(url)
    assert info.url == url and info.size == 10 and info.etag
    with pytest.raises(DatasetError, match="cannot be listed"):
        remote.list_objects(http_store.url("d/"))
    with pytest.raises(FileNotFoundError, match="no such object at http://127.0.0.1"):
        remote.head(http_store.url("d/missing.bin"))


def test_ranged_reads_whole_reads_and_checked_downloads(store, tmp_path):
    # gcp-storage-emulator's multipart upload drops a trailing b"\r" (1 run in 256 of random bytes): end in b"."
    data = os.urandom((3 << 20) - 1) + b"."
    info = remote.head(store.put("x/blob", data))
    assert info.size == len(data)
    assert transfer.read_range(info, 100, 50) == data[100:150]
    assert transfer.read_range(info.url, 0, 0) == b""
    assert transfer.read_bytes(info.url) == data
    seen: list[int] = []
    path = transfer.download(info, str(tmp_path / "blob"), on_bytes=seen.append)
    assert open(path, "rb").read() == data and sum(seen) == len(data)
    assert os.listdir(tmp_path) == ["blob"]  # no temporary file left
    with transfer.open_object(info) as stream:
        assert stream.read() == data
    with pytest.raises(ValueError, match="outside the object"):
        transfer.read_range(info, len(data) - 1, 2)


def test_missing_bucket_and_missing_object_are_named(store):
    if store.scheme != "http":
        word, bucket = {"gs": ("bucket", "no-such-bucket"), "az": ("container", "no-such-bucket"),
                        "hf": ("repository", "datasets/org/no-such-repo")}[store.scheme]
        with pytest.raises(FileNotFoundError, match=f"{word} '{bucket}' does not exist at http://127.0.0.1"):
            remote.list_objects(f"{store.scheme}://{bucket}/train/")
        with pytest.raises(FileNotFoundError, match=f"{word} '{bucket}' does not exist"):
            remote.head(f"{store.scheme}://{bucket}/train/a.tfrecord")
    with pytest.raises(FileNotFoundError, match="no such object"):
        remote.head(store.url("train/missing.tfrecord"))


def test_object_changed_or_deleted_after_listing_is_an_error(store, tmp_path):
    info = remote.head(store.put("train/a.tfrecord", b"version 1"))
    if store.scheme == "http":
        os.utime(os.path.join(str(store.admin), store.bucket, "train/a.tfrecord"), (1, 1))  # a new ETag
    store.put("train/a.tfrecord", b"version 2 is longer")
    with pytest.raises(remote.ObjectChangedError, match="changed after it was listed .* rebuild its indexes"):
        transfer.download(remote_urls.ObjectInfo(info.url, info.size, info.etag, info.last_modified, info.generation),
                        str(tmp_path / "a"))
    other = remote.head(store.put("train/b.tfrecord", b"abc"))
    store.delete("train/b.tfrecord")
    with pytest.raises(FileNotFoundError, match="disappeared after it was listed"):
        transfer.download(other, str(tmp_path / "b"))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("scheme", ["gs", "az", "http", "hf"])
def test_unreachable_endpoint_fails_after_its_attempts_and_names_it(scheme, monkeypatch, tmp_path):
    from store_servers import point_hf_at
    closed = closed_endpoint()
    point_hf_at(monkeypatch, closed, str(tmp_path / "hf-home"))
    url = {"gs": "gs://any-bucket/train/", "az": "az://any/train/", "http": f"{closed}/train/a.tfrecord",
           "hf": "hf://datasets/org/any/train/"}[scheme]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", closed)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
                       f"BlobEndpoint={closed}/devstoreaccount1;")
    with remote.options_in_force(remote.ClientOptions.of(attempts=2, timeout=2)):
        with pytest.raises(remote.UnreachableError, match=f"cannot reach the .* endpoint {closed}.* after 2 attempts"
                                                          f".*--storage-attempts"):
            remote.list_objects(url)


def test_a_store_answering_503_twice_is_retried_not_failed(gcs, tmp_path, monkeypatch):
    data = os.urandom(999) + b"."  # not b"\r" last: the emulator would drop it (test_ranged_reads_...)
    info = remote.head(gcs.put("train/a.tfrecord", data))
    with LatencyProxy(gcs.endpoint, delay_ms=0) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        proxy.add_fault(Fault("train%2Fa.tfrecord", method="GET", status=503, times=2))
        assert open(transfer.download(info, str(tmp_path / "a")), "rb").read() == data
        assert proxy.counts()["GET"] >= 3


@pytest.mark.parametrize("scheme", ["gs", "az", "http"])
def test_a_denied_request_is_one_line_naming_the_store_within_seconds(scheme, request, monkeypatch, tmp_path):
    """Issue 27: a denied request is named in one line within seconds, never retried. Azure: a wrong account key,
    refused by Azurite itself; gs and http: a 403 from the proxy in front of the store (the emulator and the file
    server check no credentials)."""
    import time
    store = request.getfixturevalue({"gs": "gcs", "az": "azure", "http": "http_store"}[scheme])
    url = store.put("train/a.tfrecord", b"0123456789")
    info = remote.head(url)
    with LatencyProxy(store.endpoint, delay_ms=0) as proxy:
        if scheme == "az":
            wrong = "d3Jvbmcga2V5IGZvciB0aGUgZGV2ZWxvcG1lbnQgYWNjb3VudA=="  # base64, not the account's key
            monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                               request.getfixturevalue("azurite_server").connection_string().replace(
                                   "AccountKey=", f"AccountKey={wrong};Was="))
        else:
            proxy.add_fault(Fault("a.tfrecord", status=403))
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
            url = url.replace(store.endpoint, proxy.url)
            info = ObjectInfo(url, info.size, info.etag, info.last_modified, info.generation)
        endpoint = proxy.url if scheme != "az" else store.endpoint
        for call in (lambda: remote.head(url), lambda: transfer.read_range(info, 0, 4),
                     lambda: transfer.download(info, str(tmp_path / "a"))):
            start = time.monotonic()
            with pytest.raises(PermissionError) as error:
                call()
            assert time.monotonic() - start < 10
            message = str(error.value)
            assert "\n" not in message and url in message and endpoint in message, message
            assert "denied" in message or "refused the credentials" in message, message
        # none retried: a HEAD may be a GET and a listing (gcsfs), a ranged read one GET, a download one or two
        assert scheme == "az" or sum(proxy.counts().values()) <= 6, proxy.counts()


# ---------------------------------------------------------------------------------------------
# Retries are the loader's own (issue 25)
# ---------------------------------------------------------------------------------------------

def test_options_are_per_thread_context_not_the_last_ones_set():
    default = remote.current_options()
    with remote.options_in_force(remote.ClientOptions.of(attempts=2, timeout=3)):
        assert (remote.current_options().attempts, remote.current_options().read_timeout) == (2, 3)
        with remote.options_in_force(remote.ClientOptions.of(attempts=5)):
            assert remote.current_options().attempts == 5
        assert remote.current_options().attempts == 2
    assert remote.current_options() == default


def numbered_shards(store, prefix: str, n: int, shards: int) -> list[str]:
    """`shards` TFRecord shards of n numbered samples (image i, label i), i dealt to shard i % shards."""
    records: list[list[bytes]] = [[] for _ in range(shards)]
    for i in range(n):
        records[i % shards].append(tfrecord.frame_record(tfrecord.encode_example(
            {"image/encoded": jpeg_bytes(i), "image/class/label": i})))
    return [store.put(f"{prefix}/train-{s:05d}-of-{shards:05d}", b"".join(r)) for s, r in enumerate(records)]


def test_two_loaders_in_one_process_keep_their_own_retries(s3, proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    numbered_shards(s3, "a", 48, 12)  # the shard cache fetches the last shards only while the loader runs
    numbered_shards(s3, "b", 48, 12)
    kw = dict(batch_size=2, train=False, cache_prefetch=1, shuffle_buffer=1, prefetch_queue_depth=1, **KW)
    hasty = DaliLoader(s3.url("a/"), storage_attempts=2, storage_timeout=5, **kw)
    patient = DaliLoader(s3.url("b/"), storage_attempts=3, storage_timeout=5, **kw)  # built last: once, its retries won
    proxy.add_fault(Fault("/a/train-00011-of-00012", method="GET", status=503, times=2))
    proxy.add_fault(Fault("/b/train-00011-of-00012", method="GET", status=503, times=2))
    assert sorted(l for _, labels in patient for l in labels.tolist() if l >= 0) == list(range(48))
    with pytest.raises(ConnectionError, match=r"train-00011-of-00012: cannot reach .* after 2 attempts"):
        list(hasty)
    assert hasty.bad_samples == []
    patient.close()
    hasty.close()


# ---------------------------------------------------------------------------------------------
# Done when: the same sets read exactly through every scheme, in one process and on 2 ranks
# ---------------------------------------------------------------------------------------------

TF_SET, FOLDER_CLASSES, PER_CLASS = 209, ("cat", "dog", "fish"), 16  # 209 records; 48 images


def tfrecord_set(put) -> list[str]:
    """209 numbered records (image i, label i) in 5 shards, written with `put(name, bytes)`."""
    records: list[list[bytes]] = [[] for _ in range(5)]
    for i in range(TF_SET):
        records[i % 5].append(tfrecord.frame_record(tfrecord.encode_example(
            {"image/encoded": jpeg_bytes(i), "image/class/label": i})))
    return [put(f"tf/train-{s:05d}-of-00005", b"".join(r)) for s, r in enumerate(records)]


def image_set(put) -> str:
    """48 images, 16 per class folder, and list.txt beside them ("class/name label"); returns the list's name."""
    lines = []
    for label, name in enumerate(FOLDER_CLASSES):
        for i in range(PER_CLASS):
            put(f"images/{name}/{i:03d}.jpg", jpeg_bytes(label * PER_CLASS + i))
            lines.append(f"{name}/{i:03d}.jpg {label}")
    return put("images/list.txt", "\n".join(lines).encode())


def local_put(root):
    def put(name: str, data: bytes) -> str:
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return path
    return put


def read_val(location, world_size: int, **kw) -> tuple[list[int], list[int]]:
    """(sorted real labels over all ranks, batches per rank) of val loaders on `world_size` ranks."""
    loaders = [DaliLoader(location, batch_size=8, train=False, rank=r, world_size=world_size, **{**KW, **kw})
               for r in range(world_size)]
    labels, lengths = [], []
    for loader in loaders:
        batches = [b.tolist() for _, b in loader]
        labels += [l for batch in batches for l in batch if l >= 0]
        lengths.append(len(batches))
        assert len(batches) == len(loader)
        loader.close()
    return sorted(labels), lengths


@pytest.fixture
def local_sets(tmp_path):
    """The same two sets on the local disk: (tfrecord folder, image folder)."""
    root = str(tmp_path / "local")
    tfrecord_set(local_put(root))
    image_set(local_put(root))
    os.remove(os.path.join(root, "images", "list.txt"))  # an image folder: classes from its subfolders
    return os.path.join(root, "tf"), os.path.join(root, "images")


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_same_sets_read_exactly_through_every_scheme(store, local_sets, tmp_path, monkeypatch, world_size):
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    shards = tfrecord_set(store.put)
    file_list = image_set(store.put)
    if store.scheme == "http":  # never listed: a list of shard URLs, and the image set's file list
        tf_location, image_location = shards, file_list
    else:
        tf_location, image_location = store.url("tf/"), store.url("images/")
    for remote_location, local_location in ((tf_location, local_sets[0]), (image_location, local_sets[1])):
        assert read_val(remote_location, world_size) == read_val(local_location, world_size)
    assert read_val(tf_location, world_size)[0] == list(range(TF_SET))


@pytest.mark.parametrize("world_size", [1, 2])
def test_native_gs_reads_exactly_what_the_cache_reads(gcs, local_sets, tmp_path, monkeypatch, world_size):
    """DALI's own GCS reader, pointed at the emulator from STORAGE_EMULATOR_HOST (remote.prepare_native)."""
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    tfrecord_set(gcs.put)
    native = DaliLoader(gcs.url("tf/"), batch_size=8, train=False, remote_feed="native", **KW)
    assert native.stats().get("shard_cache") is None  # DALI read the gs:// URLs itself
    native.close()
    assert read_val(gcs.url("tf/"), world_size, remote_feed="native") == read_val(local_sets[0], world_size)
    assert read_val(gcs.url("tf/"), world_size, remote_feed="native")[0] == list(range(TF_SET))
    assert (os.environ["DALI_GCS_ENDPOINT_URL"], os.environ["DALI_GCS_ANONYMOUS"]) == (gcs.endpoint, "1")


NATIVE_GS_JOB = """
import sys
from dali_pipes import DaliLoader
try:
    list(DaliLoader(sys.argv[1], batch_size=8, train=False, remote_feed="native", storage_attempts=2, storage_timeout=1,
                    image_size=16, device="cpu", num_threads=1))
except Exception as error:
    print(type(error).__name__, error)
"""


def test_native_gs_whose_dali_endpoint_is_unreachable_ends_in_one_connection_error(gcs, tmp_path):
    """The store answers (the layer lists it) but DALI's reader cannot reach it (DALI_GCS_ENDPOINT_URL): a network
    fault, not a bad sample, ending after the loader's attempts. In a process of its own: DALI keeps the GCS
    endpoint of its first use for the life of a process."""
    tfrecord_set(gcs.put)
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "DALI_PIPES_CACHE": str(tmp_path / "cache"),
           "DALI_GCS_ENDPOINT_URL": closed_endpoint()}
    run = subprocess.run([sys.executable, "-c", NATIVE_GS_JOB, gcs.url("tf/")], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.stdout.startswith("UnreachableError ") and "DALI's reader failed 3 times in a row on network errors" \
        in run.stdout and "DALI_GCS_ENDPOINT_URL" in run.stdout, run.stdout + run.stderr[-2000:]


def test_native_feed_on_a_scheme_dali_cannot_read_says_so(azure, tmp_path, monkeypatch):
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    tfrecord_set(azure.put)
    with pytest.raises(ValueError, match=r"remote_feed='native' but DALI reads only s3://, gs:// .*'cache'"):
        DaliLoader(azure.url("tf/"), batch_size=8, train=False, remote_feed="native", **KW)


# ---------------------------------------------------------------------------------------------
# hf:// through huggingface_hub's HfFileSystem, against a local Hub mirror (store_servers.HubMirror)
# ---------------------------------------------------------------------------------------------

def test_hub_repos_are_listed_and_globbed_through_hffilesystem(hub):
    import hashlib
    names = ["README.md", "data/test-00000-of-00001.parquet", "data/train-00000-of-00002.parquet",
             "data/train-00001-of-00002.parquet", "images/cat/0.jpg", "images/dog/sub/1.jpg"]
    for name in names:
        hub.put(name, name.encode())
    assert keys(remote.list_objects(hub.url())) == names  # 11 entries: three pages of the mirror's 5
    assert keys(remote.list_objects(hub.url("data/"))) == names[1:4]
    assert keys(remote.list_objects(hub.url("data/train-*-of-00002.parquet"))) == names[2:4]
    assert keys(remote.list_objects(hub.url("images/*/0.jpg"))) == ["images/cat/0.jpg"]
    (info,) = remote.list_objects(hub.url("data/train-00001-of-00002.parquet"))
    data = names[3].encode()
    assert (info.size, info.etag) == (len(data), hashlib.sha256(data).hexdigest())  # its LFS id: the content
    assert info == remote.head(info.url) and transfer.read_range(info, 5, 10) == data[5:15]
    with pytest.raises(FileNotFoundError, match="no objects match"):
        remote.list_objects(hub.url("val/"))


def test_the_hub_mirror_hashes_a_settled_file_once_and_a_fresh_one_each_time(tmp_path, monkeypatch):
    """Its ids (the Hub's oid and LFS sha256) are hashed once per version of a file, not on every ranged GET (the
    benchmark's store shares the host with the decode); a file changed within RACY_S is hashed each time."""
    import hashlib

    from dali_pipes_bench.servers import store_servers
    ids = lambda data: (hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(), hashlib.sha256(data).hexdigest())
    path = tmp_path / "train-0.tfrecord"
    path.write_bytes(b"a" * 1000)
    before = store_servers._hashed.cache_info()
    assert [store_servers._file_ids(str(path)) for _ in range(3)] == [ids(b"a" * 1000)] * 3
    path.write_bytes(b"b" * 1000)  # the same size at once: its times may not have ticked
    assert store_servers._file_ids(str(path)) == ids(b"b" * 1000)
    assert store_servers._hashed.cache_info()[:2] == before[:2]  # fresh files: hashed, not remembered
    monkeypatch.setattr(store_servers, "RACY_S", 0.0)  # now: as if written long ago
    path.write_bytes(b"c" * 1001)
    assert [store_servers._file_ids(str(path)) for _ in range(3)] == [ids(b"c" * 1001)] * 3
    after = store_servers._hashed.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 2)


def test_a_revision_in_the_url_reads_that_revision(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    tfrecord_set(hub.put)  # main: 209 records
    for revision, n in (("v1.0", 20), ("refs/convert/parquet", 30)):
        for s in range(2):
            hub.put(f"tf/train-{s:05d}-of-00002", b"".join(tfrecord.frame_record(tfrecord.encode_example(
                {"image/encoded": jpeg_bytes(i), "image/class/label": i})) for i in range(s, n, 2)), revision)
    assert RemoteUrl.parse(f"hf://{hub.bucket}@refs/convert/parquet/tf/a") == \
        RemoteUrl("hf", f"{hub.bucket}@refs/convert/parquet", "tf/a")
    assert read_val(hub.url("tf/"), 1)[0] == list(range(TF_SET))
    assert read_val(f"hf://{hub.bucket}@v1.0/tf/", 2)[0] == list(range(20))
    assert read_val(f"hf://{hub.bucket}@refs/convert/parquet/tf/", 2)[0] == list(range(30))
    assert remote.list_objects(f"hf://{hub.bucket}@v1.0/tf/")[0].url == f"hf://{hub.bucket}@v1.0/tf/train-00000-of-00002"
    with pytest.raises(FileNotFoundError, match=f"revision 'v9' of {hub.bucket} does not exist at http://127.0.0.1"):
        remote.list_objects(f"hf://{hub.bucket}@v9/tf/")


def test_hf_token_goes_as_a_bearer_header_and_each_refusal_is_one_line_not_retried(tmp_path, monkeypatch, caplog):
    """A mirror where every repo is private to one token (and one is gated): read exactly with HF_TOKEN; without
    it, with a wrong one, a missing repo, a gated file: each a one-line error, raised at once (no retries)."""
    from dali_pipes.tools.cli import main

    from store_servers import HubMirror, Store, point_hf_at
    root = tmp_path / "hub"
    private, gated = (Store("hf", f"datasets/org/{name}", "", root) for name in ("private", "gated"))
    tfrecord_set(private.put)
    gated.put("tf/a.tfrecord", b"x" * 16)
    with HubMirror(str(root), token="hf_secret", gated=(gated.bucket,)) as server:
        point_hf_at(monkeypatch, server.endpoint, str(tmp_path / "hf-home"))
        monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
        refusals = []
        with pytest.raises(PermissionError, match="answered 401 to a request without a token: the repository is "
                                                  "private or gated, or does not exist; set HF_TOKEN") as error:
            remote.list_objects(private.url("tf/"))
        refusals.append(error.value)
        with pytest.raises(SystemExit, match="error: .*set HF_TOKEN"):  # dali-pipes and python -m train alike
            main(["index", private.url("tf/")])
        monkeypatch.setenv("HF_TOKEN", "hf_wrong")
        with pytest.raises(PermissionError, match=r"refused HF_TOKEN \(401\)") as error:
            remote.list_objects(private.url("tf/"))
        refusals.append(error.value)
        monkeypatch.setenv("HF_TOKEN", "hf_secret")  # the mirror answers nothing without it
        assert read_val(private.url("tf/"), 2)[0] == list(range(TF_SET))
        with pytest.raises(FileNotFoundError, match="repository 'datasets/org/missing' does not exist") as error:
            remote.list_objects("hf://datasets/org/missing/tf/")
        refusals.append(error.value)
        (info,) = remote.list_objects(gated.url("tf/"))  # a gated repo's files are listed, not read
        with pytest.raises(PermissionError, match=r"access denied by http://127.0.0.1:\d+ \(403\); .*gated") as error:
            transfer.read_range(info, 0, 4)
        refusals.append(error.value)
    assert all("\n" not in str(e) for e in refusals)
    assert not [r for r in caplog.records if "trying again" in r.getMessage()]


def test_converting_to_hf_is_refused_in_one_line(hub, tmp_path):
    from dali_pipes.tools.cli import main

    from conftest import write_folder
    write_folder(str(tmp_path / "images"))
    with pytest.raises(SystemExit, match="hf:// locations are read-only here.*hf upload"):
        main(["convert", "tfrecord", str(tmp_path / "images"), hub.url("out/"), "--workers", "1"])


# ---------------------------------------------------------------------------------------------
# Outages: as S3's (a short one ridden out with the same batches, a long one a ConnectionError)
# ---------------------------------------------------------------------------------------------

def test_gs_outages_behave_as_s3s(gcs, tmp_path, monkeypatch):
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    numbered_shards(gcs, "o", 48, 12)
    kw = dict(batch_size=2, train=False, cache_prefetch=1, shuffle_buffer=1, prefetch_queue_depth=1, **KW)
    calm = DaliLoader(gcs.url("o/"), **kw)
    expected = [labels.tolist() for _, labels in calm]
    calm.close()
    with LatencyProxy(gcs.endpoint, delay_ms=0) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        short = DaliLoader(gcs.url("o/"), storage_attempts=4, **kw)
        proxy.add_fault(Fault("train-00011-of-00012", method="GET", status=503, times=2))
        assert [labels.tolist() for _, labels in short] == expected  # ridden out, the same batches
        short.close()
        long = DaliLoader(gcs.url("o/"), storage_attempts=2, storage_timeout=1, **kw)
        proxy.add_fault(Fault("train-00011-of-00012", method="GET", status=503))
        with pytest.raises(ConnectionError, match="cannot reach the GCS endpoint .* after 2 attempts"):
            list(long)
        assert long.bad_samples == []  # the store, not a sample: nothing excluded
        long.close()


# ---------------------------------------------------------------------------------------------
# The commands on every scheme: convert writes there, verify and the loader read it back
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_convert_to_a_bucket_then_verify_and_read(scheme, request, tmp_path, monkeypatch, capsys):
    import collections

    from dali_pipes.tools.cli import main

    from conftest import write_folder
    store = request.getfixturevalue({"gs": "gcs", "az": "azure"}[scheme])
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    expected = write_folder(str(tmp_path / "images"))
    assert main(["convert", "tfrecord", str(tmp_path / "images"), store.url("out/"), "--shards", "2",
                 "--workers", "1", "--prefix", "train"]) == 0
    assert sorted(keys(remote.list_objects(store.url("out/")))) == sorted(
        ["out/classes.json", "out/manifest.json"] + [f"out/train-{i:05d}-of-00002.tfrecord{idx}"
                                                     for i in range(2) for idx in ("", ".idx")])
    assert main(["verify", store.url("out/"), "--workers", "1"]) == 0
    assert f"{len(expected)} samples checked, 0 problems" in capsys.readouterr().out
    loader = DaliLoader(store.url("out/"), batch_size=4, train=False, **KW)
    labels = [l for _, batch in loader for l in batch.tolist() if l >= 0]
    assert collections.Counter(labels) == collections.Counter(expected.values())
    assert loader.source.classes == ["cat", "dog", "fish"]
    loader.close()


def test_verify_reads_an_http_file_list_and_names_a_bad_image_by_its_url(http_store, tmp_path, monkeypatch, capsys):
    from dali_pipes.tools.cli import main
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    listed = image_set(http_store.put)
    http_store.put("images/dog/004.jpg", jpeg_bytes(20)[:40])  # cut short
    assert main(["verify", listed, "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert http_store.url("images/dog/004.jpg") in out and "48 samples checked, 1 problems" in out
    from conftest import write_folder
    write_folder(str(tmp_path / "images"))
    with pytest.raises(SystemExit, match="http.*read-only"):  # one line, no traceback
        main(["convert", "tfrecord", str(tmp_path / "images"), http_store.url("out/"), "--workers", "1"])


def located_tfrecord_set(store) -> str:
    """The 209-record set of tfrecord_set on `store`, as the location a command takes: its prefix, or on http
    (never listed) a list file of its shards."""
    shards = tfrecord_set(store.put)
    if not remote_urls.scheme_of(store.url()).startswith("http"):
        return store.url("tf/")
    return store.put("tf/shards.txt", "\n".join(remote_urls.basename(u) for u in shards).encode())


COMMAND_FIXTURES = {"s3": "s3", "gs": "gcs", "az": "azure", "http": "http_store", "hf": "hub"}


@pytest.mark.parametrize("scheme", list(COMMAND_FIXTURES))
def test_index_builds_and_lists_each_remote_shards_count(scheme, request, tmp_path, monkeypatch, capsys):
    from dali_pipes.tools.cli import main
    store = request.getfixturevalue(COMMAND_FIXTURES[scheme])
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    location = located_tfrecord_set(store)
    assert main(["index", location]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[0] for line in lines] == [store.url(f"tf/train-{s:05d}-of-00005") for s in range(5)]
    assert [int(line.split(": ")[1].split()[0]) for line in lines] == [42, 42, 42, 42, 41]
    assert all(line.split(" index ")[1].startswith(str(tmp_path / "cache")) for line in lines)


@pytest.mark.parametrize("scheme", list(COMMAND_FIXTURES))
def test_profile_runs_on_each_scheme(scheme, request, tmp_path, monkeypatch):
    import json
    store = request.getfixturevalue(COMMAND_FIXTURES[scheme])
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    location = located_tfrecord_set(store)
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "dali_pipes.tools.cli", "profile", location, "--rounds", "1",
                          "--min-seconds", "0", "--min-epochs", "0", "--batches", "2", "--warmup", "1",
                          "--batch-size", "8", "--image-size", "16", "--device", "cpu", "--val", "--out", str(out)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.load(open(out / "profile.json"))
    assert result["kind"] == "tfrecord" and result["rows"] and all(r["images_per_s"] > 0 for r in result["rows"])


def test_train_from_gs(gcs, tmp_path):
    import json
    numbered_shards(gcs, "train", 32, 2)
    cmd = [sys.executable, "-m", "train", "--data", gcs.url("train/"), "--device", "cpu", "--arch", "resnet10",
           "--width", "8", "--image-size", "16", "--batch-size", "8", "--epochs", "1", "--workdir",
           str(tmp_path / "run"), "--threads", "1", "--val-data", gcs.url("train/"), "--cache-prefetch", "2",
           "--num-classes", "32"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd(),
                              "DALI_PIPES_CACHE": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert lines and lines[-1]["epoch"] == 0


@pytest.mark.parametrize("scheme", ["az", "http"])
def test_a_ranged_read_of_a_replaced_object_is_refused_where_reads_are_pinned(scheme, request):
    """Pinned stores (If-Match) refuse a ranged read of an object replaced since it was listed, so an index
    or a record read mid-shard never mixes two versions; before Azure's reads were pinned this returned the new
    bytes (its check was a HEAD after whole downloads only)."""
    store = request.getfixturevalue({"az": "azure", "http": "http_store"}[scheme])
    info = remote.head(store.put("train/a.tfrecord", b"version 1 of the shard"))
    if scheme == "http":
        os.utime(os.path.join(str(store.admin), store.bucket, "train/a.tfrecord"), (1, 1))  # a new ETag
    store.put("train/a.tfrecord", b"version 2 of the shard")  # the same size: only the ETag tells them apart
    assert remote.head(info.url).etag != info.etag
    with pytest.raises(remote.ObjectChangedError, match="changed after it was listed"):
        transfer.read_range(info, 0, 9)
    assert transfer.read_range(remote.head(info.url), 0, 9) == b"version 2"


def test_a_pinned_azure_read_from_a_stalled_store_ends_after_its_attempts(azure, azurite_server, monkeypatch):
    """Azure's pinned reads go to the SDK's blob client, not through adlfs: they keep the loader's timeout."""
    import time
    info = remote.head(azure.put("train/a.tfrecord", b"0123456789"))
    with LatencyProxy(azure.endpoint, delay_ms=4000) as proxy:  # every reply 4 s late
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_server.connection_string(proxy.url))
        start = time.monotonic()
        with remote.options_in_force(remote.ClientOptions.of(attempts=2, timeout=1)):
            with pytest.raises(remote.UnreachableError, match="after 2 attempts"):
                transfer.read_range(info, 0, 4)
        assert time.monotonic() - start < 8


# ---------------------------------------------------------------------------------------------
# Stores that misbehave end in one clear line, in bounded time (issue 32)
# ---------------------------------------------------------------------------------------------

class _QuietHandler:
    def log_message(self, *args) -> None:  # no request lines on the test's stderr
        pass


def _serve(handler) -> tuple:
    """`handler` on 127.0.0.1 in a daemon thread: (server, "http://127.0.0.1:PORT")."""
    import http.server
    import threading
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def dripping_handler(data: bytes, per_second: int = 256, headers: dict | None = None):
    """An HTTP handler that answers HEAD at once and each GET (ranged: 206) 16 bytes at a time, `per_second`
    bytes a second: never silent as long as the read timeout, never done in time. `headers`: sent with each reply
    (an S3 store's ETag and Last-Modified)."""
    import http.server
    import time

    class Drip(_QuietHandler, http.server.BaseHTTPRequestHandler):
        def end_headers(self) -> None:
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            super().end_headers()

        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()

        def do_GET(self) -> None:
            first, last = 0, len(data) - 1
            if self.headers.get("Range"):
                first_text, last_text = self.headers["Range"].removeprefix("bytes=").split("-")
                first, last = int(first_text), min(last, int(last_text or last))
            self.send_response(206 if self.headers.get("Range") else 200)
            self.send_header("Content-Length", str(last + 1 - first))
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
            self.end_headers()
            try:
                for at in range(first, last + 1, 16):
                    self.wfile.write(data[at:min(at + 16, last + 1)])
                    self.wfile.flush()
                    time.sleep(16 / per_second)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up: the point of the test
                pass
    return Drip


def test_a_dripping_http_store_ends_at_the_download_deadline_naming_the_url_and_the_flag(tmp_path, caplog):
    """256 bytes a second keeps every read under the read timeout, so only an overall deadline ends it: a 2 KiB
    object would take 8 s, the deadline is 2 s. A slow download is warned of (with its progress) first."""
    import time
    server, base = _serve(dripping_handler(bytes(range(256)) * 8))
    try:
        url = f"{base}/train/a.tfrecord"
        info = remote.head(url)
        with remote.options_in_force(remote.ClientOptions.of(deadline=2)), caplog.at_level("WARNING", "dali_pipes"):
            for call in (lambda: transfer.download(info, str(tmp_path / "a")),
                         lambda: transfer.read_range(info, 0, 2048), lambda: transfer.read_bytes(url)):
                start = time.monotonic()
                with pytest.raises(remote.DownloadTooSlowError,
                                   match=f"{url}: not downloaded within 2 s .*--download-deadline"):
                    call()
                assert time.monotonic() - start < 5
        assert f"{url}: slow download" in caplog.text and "--download-deadline" in caplog.text
        assert os.listdir(tmp_path) == []  # no partial copy left
    finally:
        server.shutdown()


def test_a_dripping_s3_store_ends_at_the_download_deadline(tmp_path, monkeypatch, aws_empty_file):
    """boto3's read timeout is per socket read and it has no overall one: the body is cut at the deadline."""
    import time

    from s3_server import keep_s3_options, point_aws_at
    pytest.importorskip("boto3", reason="s3:// support needs boto3: pip install '.[s3]'")
    server, base = _serve(dripping_handler(bytes(range(256)) * 8, headers={
        "ETag": '"0123456789abcdef0123456789abcdef"', "Last-Modified": "Fri, 27 Nov 2026 00:00:00 GMT"}))
    point_aws_at(monkeypatch, base, aws_empty_file)
    keep_s3_options(monkeypatch)
    try:
        url = "s3://bucket/train/a.tfrecord"
        info = remote.head(url)
        with remote.options_in_force(remote.ClientOptions.of(deadline=2)):
            for call in (lambda: transfer.download(info, str(tmp_path / "a")),
                         lambda: transfer.read_range(info, 0, 2048)):
                start = time.monotonic()
                with pytest.raises(remote.DownloadTooSlowError, match=f"{url}: not downloaded within 2 s"):
                    call()
                assert time.monotonic() - start < 5
        assert os.listdir(tmp_path) == []
    finally:
        server.shutdown()


def test_the_download_deadline_is_a_loader_keyword_and_a_flag():
    import argparse

    from dali_pipes.config import LoaderConfig
    from dali_pipes.options import add_arguments
    parser = argparse.ArgumentParser()
    add_arguments(parser, LoaderConfig, "loader")
    assert parser.parse_args(["--download-deadline", "30"]).download_deadline == 30.0
    assert LoaderConfig().download_deadline == remote.ClientOptions().deadline == 600.0
    with pytest.raises(ValueError, match="download_deadline must be > 0"):
        remote.ClientOptions.of(deadline=0)


def test_a_server_that_ignores_range_requests_is_read_whole_never_cut_short(tmp_path, caplog):
    """python -m http.server answers a ranged GET with 200 and the whole body: the bytes asked for are in it."""
    import functools
    import http.server
    (tmp_path / "site").mkdir()
    data = os.urandom(5000)
    (tmp_path / "site" / "a.bin").write_bytes(data)

    class Plain(_QuietHandler, http.server.SimpleHTTPRequestHandler):
        pass
    server, base = _serve(functools.partial(Plain, directory=str(tmp_path / "site")))
    try:
        info = remote.head(f"{base}/a.bin")
        with caplog.at_level("WARNING", "dali_pipes"):
            assert transfer.read_range(info, 100, 12) == data[100:112]
            assert transfer.read_bytes(info.url) == data
            assert open(transfer.download(info, str(tmp_path / "copy")), "rb").read() == data
        assert f"{base}/a.bin: the server ignores Range requests" in caplog.text
        assert "cut short" not in caplog.text
    finally:
        server.shutdown()


def test_an_object_replaced_after_listing_is_object_changed_on_every_scheme(store, tmp_path):
    """The same size (only the version tells them apart) and a shorter one (never "cut short"): on a store that
    ignores generation preconditions (the GCS emulator) the check after the download must ask the store, not
    gcsfs's listing cache."""
    store.put("train/a.tfrecord", b"version 1 of the shard")
    listed = remote.heads([store.url("train/a.tfrecord")]) if store.scheme == "http" else \
        remote.list_objects(store.url("train/"))
    for replacement in (b"version 2 of the shard", b"v3"):
        if store.scheme == "http":
            os.utime(store.file("train/a.tfrecord"), (1, 1))  # a new ETag
        store.put("train/a.tfrecord", replacement)
        with pytest.raises(remote.ObjectChangedError, match="changed after it was listed"):
            transfer.download(listed[0], str(tmp_path / "a"))
    assert os.listdir(tmp_path) == []
