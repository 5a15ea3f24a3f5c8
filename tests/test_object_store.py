"""object_store against a real S3 API: moto's server on 127.0.0.1, over HTTP, with real boto3.

Faults a healthy server does not make (a body cut short, an injected 403) come from the latency
proxy in front of it; every other error is the server's own reply."""

import os

import pytest

from dali_pipes.errors import DatasetError
from dali_pipes.storage import object_store, remote, remote_urls, transfer
from dali_pipes.storage.object_store import S3Url
from dali_pipes.storage.remote_urls import ObjectInfo
from dali_pipes_bench.servers.latency_proxy import Fault

from s3_server import closed_endpoint

pytest_plugins = ["s3_server"]  # fixtures: s3 (a bucket on a local moto server), proxy
pytest.importorskip("boto3", reason="s3:// support needs boto3: pip install '.[s3]' (from the dali_pipes checkout)")
pytest.importorskip("moto.server", reason="the S3 tests need a local S3 server: pip install 'moto[server]'")


def keys(infos: list[ObjectInfo]) -> list[str]:
    return [S3Url.parse(info.url).key for info in infos]


def test_urls_parse_join_and_relate():
    assert S3Url.parse("s3://bkt/a/b.tfrecord") == S3Url("bkt", "a/b.tfrecord")
    assert S3Url.parse("s3://bkt") == S3Url("bkt", "") and str(S3Url("bkt", "a/")) == "s3://bkt/a/"
    assert remote_urls.join("s3://bkt/data/", "cat/1.jpg") == "s3://bkt/data/cat/1.jpg"
    assert remote_urls.join("s3://bkt", "x") == "s3://bkt/x"
    assert remote_urls.dirname("s3://bkt/data/list.txt") == "s3://bkt/data/"
    assert remote_urls.relative_to("s3://bkt/data/cat/1.jpg", "s3://bkt/data") == "cat/1.jpg"
    assert object_store.is_remote("s3://bkt/x") and not object_store.is_remote("/data/s3:/x")
    assert not object_store.is_remote(["s3://bkt/x"])
    with pytest.raises(ValueError, match="no bucket"):
        S3Url.parse("s3:///key")
    with pytest.raises(ValueError, match="not below"):
        remote_urls.relative_to("s3://bkt/other/1.jpg", "s3://bkt/data/")


def test_client_takes_the_endpoint_from_aws_endpoint_url(s3):
    assert object_store.s3_client().meta.endpoint_url == s3.endpoint


def test_lists_a_prefix_recursively_in_key_order_with_sizes_and_etags(s3):
    for key in ("d/b.tfrecord", "d/a.tfrecord", "d/sub/c.tfrecord", "other/x", "d-sibling/y"):
        s3.put(key, key.encode())
    found = remote.list_objects(s3.url("d/"))
    assert keys(found) == ["d/a.tfrecord", "d/b.tfrecord", "d/sub/c.tfrecord"]
    head = s3.client.head_object(Bucket=s3.bucket, Key="d/a.tfrecord")
    assert found[0] == ObjectInfo(s3.url("d/a.tfrecord"), len(b"d/a.tfrecord"), head["ETag"],
                                  head["LastModified"].timestamp())
    assert keys(remote.list_objects(s3.url("d"))) == keys(found)  # no slash: still the folder
    assert keys(remote.list_objects(s3.url("d/a.tfrecord"))) == ["d/a.tfrecord"]  # one object


def test_glob_matches_within_one_path_segment(s3):
    for key in ("im/train-00000-of-00002", "im/train-00001-of-00002", "im/val-00000-of-00001",
                "im/train-extra/train-1-of-2", "im/train-00000-of-00002.idx"):
        s3.put(key, b"x")
    found = remote.list_objects(s3.url("im/train-*-of-00002"))
    assert keys(found) == ["im/train-00000-of-00002", "im/train-00001-of-00002"]
    assert keys(remote.list_objects(s3.url("im/*/train-?-of-2"))) == ["im/train-extra/train-1-of-2"]


def test_listing_follows_pages(s3):
    for i in range(7):
        s3.put(f"many/{i:05d}", b"")
    assert len(remote.list_objects(s3.url("many/"), page_size=3)) == 7
    assert len(remote.list_objects(s3.url("many/0000[0-4]"), page_size=2)) == 5


def test_missing_bucket_is_named(s3):
    with pytest.raises(FileNotFoundError, match="bucket 'no-such-bucket' does not exist at http://127.0.0.1"):
        remote.list_objects("s3://no-such-bucket/train/")
    with pytest.raises(FileNotFoundError, match="bucket 'no-such-bucket' does not exist"):
        remote.head("s3://no-such-bucket/train/a.tfrecord")


def test_no_match_names_the_pattern_and_where_it_looked(s3):
    s3.put("train/a.tfrecord", b"x")
    with pytest.raises(FileNotFoundError, match=r"no objects match .* below s3://bucket-.*/train/b"):
        remote.list_objects(s3.url("train/b*.tfrecord"))
    with pytest.raises(FileNotFoundError, match="no objects match"):
        remote.list_objects(s3.url("val/"))
    with pytest.raises(FileNotFoundError, match="no such object"):
        remote.head(s3.url("train/missing.tfrecord"))


def test_no_credentials_says_how_to_give_them(s3, monkeypatch):
    # The fixture left empty ~/.aws files, no profile and no EC2 metadata: only the keys remain.
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(PermissionError, match="no AWS credentials found .* AWS_ACCESS_KEY_ID"):
        remote.list_objects(s3.url("train/"))


def test_access_denied_is_a_permission_error_naming_the_bucket(restricted_s3, tmp_path):
    server = restricted_s3  # a real 403 from moto's IAM checks
    (info,) = remote.list_objects(f"s3://{server.bucket}/train/")  # listing is allowed
    with pytest.raises(PermissionError, match=r"access denied .*AccessDenied.* s3:GetObject"):
        transfer.download(info, str(tmp_path / "a"))
    with pytest.raises(PermissionError, match="access denied"):
        remote.head(f"s3://{server.bucket}/{server.key}")


def test_injected_403_is_access_denied(proxy, s3, tmp_path):
    info = remote.head(s3.put("train/a.tfrecord", b"abc"))
    proxy.add_fault(Fault("/train/a.tfrecord", method="GET", status=403))
    with pytest.raises(PermissionError, match="access denied by http://127.0.0.1"):
        transfer.download(info, str(tmp_path / "a"))


def test_unreachable_endpoint_fails_after_its_attempts_and_names_it(s3, monkeypatch):
    closed = closed_endpoint()
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    remote.configure(attempts=2, timeout=2)
    with pytest.raises(remote.UnreachableError,
                       match=f"cannot reach the S3 endpoint {closed} after 2 attempts"
                             f".*AWS_ENDPOINT_URL.*--storage-attempts"):
        remote.list_objects("s3://any-bucket/train/")


def test_default_retries_wait_at_least_30_s_with_jitter():
    import random
    assert remote.ClientOptions().attempts == 8 and remote.ClientOptions().min_wait() >= 30
    for seed in range(20):
        waits = list(remote.backoff_delays(8, random.Random(seed)))
        assert len(waits) == 7 and sum(waits) >= 30
        assert [1 <= w / min(16, 2 ** k) * 2 < 2 for k, w in enumerate(waits)] == [True] * 7
    assert len(set(remote.backoff_delays(8))) == 7  # jittered: never two equal waits


def test_a_store_answering_503_twice_is_retried_not_failed(proxy, s3, tmp_path):
    data = os.urandom(1000)
    info = remote.head(s3.put("train/a.tfrecord", data))
    proxy.reset_counts()
    proxy.add_fault(Fault("/train/a.tfrecord", method="GET", status=503, times=2))
    assert open(transfer.download(info, str(tmp_path / "a")), "rb").read() == data
    assert proxy.counts()["GET"] == 3


def test_a_slow_endpoint_fails_within_the_set_timeout(proxy, s3):
    info = remote.head(s3.put("train/a.tfrecord", b"abc"))
    remote.configure(attempts=2, timeout=0.5)
    proxy.delay_s = 3.0  # each request waits longer than the timeout before it is answered
    with pytest.raises(remote.UnreachableError, match=f"{info.url}: cannot reach .* after 2 attempts .*timeout"):
        transfer.read_range(info, 0, 3)


def test_download_checks_and_renames_atomically(s3, tmp_path):
    data = os.urandom(3 << 20)
    info = remote.head(s3.put("train/big.tfrecord", data))
    seen = []
    path = transfer.download(info, str(tmp_path / "big"), on_bytes=seen.append)
    assert open(path, "rb").read() == data and sum(seen) == len(data)
    assert os.listdir(tmp_path) == ["big"]  # no temporary file left


def test_object_changed_between_listing_and_download(s3, tmp_path):
    info = remote.head(s3.put("train/a.tfrecord", b"version 1"))
    s3.put("train/a.tfrecord", b"version 2 is longer")
    with pytest.raises(remote.ObjectChangedError, match="changed after it was listed .* rebuild its indexes"):
        transfer.download(info, str(tmp_path / "a"))
    with pytest.raises(DatasetError, match="changed after it was listed"):
        transfer.read_range(info, 0, 4)
    assert os.listdir(tmp_path) == []


def test_object_deleted_mid_epoch(s3, tmp_path):
    info = remote.head(s3.put("train/a.tfrecord", b"abc"))
    s3.delete("train/a.tfrecord")
    with pytest.raises(FileNotFoundError, match="disappeared after it was listed"):
        transfer.download(info, str(tmp_path / "a"))
    assert os.listdir(tmp_path) == []


def test_truncated_body_is_an_error_after_bounded_retries(proxy, s3, tmp_path):
    info = remote.head(s3.put("train/a.tfrecord", os.urandom(200_000)))
    proxy.reset_counts()
    proxy.add_fault(Fault("/train/a.tfrecord", method="GET", truncate_at=1000))
    with pytest.raises(remote.TruncatedDownloadError, match="cut short: 1000 of 200000 bytes"):
        transfer.download(info, str(tmp_path / "a"), attempts=2)
    assert proxy.counts()["GET"] == 2 and os.listdir(tmp_path) == []


def test_one_truncated_body_is_retried(proxy, s3, tmp_path):
    data = os.urandom(200_000)
    info = remote.head(s3.put("train/a.tfrecord", data))
    proxy.add_fault(Fault("/train/a.tfrecord", method="GET", truncate_at=1000, times=1))
    assert open(transfer.download(info, str(tmp_path / "a")), "rb").read() == data


def test_read_range_and_read_bytes(s3):
    data = bytes(range(256)) * 10
    info = remote.head(s3.put("x/blob", data))
    assert transfer.read_range(info, 100, 50) == data[100:150]
    assert transfer.read_range(info, 0, 0) == b""
    assert transfer.read_bytes(info.url) == data
    with pytest.raises(ValueError, match="outside the object"):
        transfer.read_range(info, len(data) - 1, 2)


def test_upload_round_trips(s3, tmp_path):
    local = tmp_path / "shard.tfrecord"
    local.write_bytes(b"0123456789" * 1000)
    info = transfer.upload(str(local), s3.url("out/shard.tfrecord"))
    assert info.size == 10_000 and transfer.read_bytes(info.url) == local.read_bytes()
    with pytest.raises(FileNotFoundError, match="bucket 'no-such-bucket' does not exist"):
        transfer.upload(str(local), "s3://no-such-bucket/out/shard.tfrecord")


def test_version_changes_with_the_object(s3):
    first = remote.head(s3.put("a", b"one"))
    second = remote.head(s3.put("a", b"two"))
    assert first.version != second.version
    assert remote.head(second.url).version == second.version  # stable while unchanged


def test_open_object_streams_a_tar_once(s3):
    import io
    import tarfile
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as tar:
        for name in ("0001.jpg", "0001.cls"):
            member = tarfile.TarInfo(name)
            member.size = 3
            tar.addfile(member, io.BytesIO(b"abc"))
    info = remote.head(s3.put("shards/a.tar", payload.getvalue()))
    with transfer.open_object(info) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        assert [m.name for m in tar] == ["0001.jpg", "0001.cls"]
    with transfer.open_object(info) as stream:
        assert stream.read() == payload.getvalue()
