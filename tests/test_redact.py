"""Secrets never leave the process (storage/redact.py): known secret strings are planted in every credential
channel (a presigned http URL's query string and user info, an Azure SAS and account key in
AZURE_STORAGE_CONNECTION_STRING, HF_TOKEN, AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN) and searched for in
every loader state, log line, warning, exception (with the errors it was raised from), cache file name, the
files of a `python -m train` run and the doctor's report, against real servers on 127.0.0.1."""

import base64
import json
import logging
import os
import pickle
import subprocess
import sys
import traceback

import pytest

from dali_pipes import DaliLoader
from dali_pipes.data.formats import tfrecord
from dali_pipes.storage import remote, remote_urls

from conftest import jpeg_bytes
from s3_server import closed_endpoint

pytest_plugins = ["store_servers", "s3_server"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KW = dict(image_size=16, device="cpu", num_threads=1, val_padding="label")  # val: each sample once, -1 padding
SIGNATURE, FRESH_SIGNATURE = "feedc0de" * 8, "c0ffee42" * 8  # 64 hex characters, as S3 signs
SESSION_TOKEN = "PlantedSessionToken" * 12
CREDENTIAL = "AKIAPLANTEDCREDENTIAL"
PASSWORD = "PlantedUrlPassword"
PLANTED = [SIGNATURE, FRESH_SIGNATURE, SESSION_TOKEN, CREDENTIAL, PASSWORD]


def presigned(url: str, signature: str = SIGNATURE) -> str:
    """`url` as S3 presigns it: the usual X-Amz-* fields, a session token, a 64-character signature."""
    return (f"{url}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={CREDENTIAL}%2F20260101%2Fus-east-1%2Fs3"
            f"%2Faws4_request&X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
            f"&X-Amz-Security-Token={SESSION_TOKEN}&X-Amz-Signature={signature}")


def numbered_shards(put, n: int = 24, shards: int = 2) -> list[str]:
    """n records (image i, label i) in `shards` TFRecord shards written with put(name, bytes)."""
    records: list[list[bytes]] = [[] for _ in range(shards)]
    for i in range(n):
        records[i % shards].append(tfrecord.frame_record(tfrecord.encode_example(
            {"image/encoded": jpeg_bytes(i), "image/class/label": i})))
    return [put(f"tf/train-{s:05d}-of-{shards:05d}", b"".join(r)) for s, r in enumerate(records)]


def leaks(text: str | bytes, planted: list[str] = PLANTED) -> list[str]:
    """The planted secrets found in `text` (bytes: also as UTF-16, as a pickle or a torch file may hold them)."""
    if isinstance(text, bytes):
        return [s for s in planted if s.encode() in text or s.encode("utf-16-le") in text]
    return [s for s in planted if s in text]


def ours(caplog) -> str:
    """What the project logged (the dali_pipes logger): an SDK's own debug lines are its and its user's."""
    return "\n".join(f"{r.getMessage()} {r.args}" for r in caplog.records if r.name.startswith("dali_pipes"))


def error_text(error: BaseException) -> str:
    """Everything a traceback of `error` prints: its text and the errors it was raised from."""
    return "".join(traceback.format_exception(error))


def test_presigned_urls_leave_no_secret_in_states_logs_errors_or_cache_names_and_resume_under_a_fresh_one(
        http_store, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="dali_pipes")
    cache = tmp_path / "cache"
    monkeypatch.setenv("DALI_PIPES_CACHE", str(cache))
    urls = numbered_shards(http_store.put)
    first = DaliLoader([presigned(u) for u in urls], batch_size=8, train=False, **KW)
    batches = iter(first)
    seen = next(batches)[1].tolist()
    state = first.state_dict()
    names = [name for _, folders, files in os.walk(cache) for name in folders + files]
    first.close()
    assert not leaks(pickle.dumps(state)) and not leaks(repr(state))
    assert names and not leaks(" ".join(names)) and max(len(n.encode()) for n in names) < 120
    # the caller passes the URLs again, signed afresh: the same objects, the same data
    second = DaliLoader([presigned(u, FRESH_SIGNATURE) for u in urls], batch_size=8, train=False, **KW)
    second.load_state_dict(state)
    seen += [label for _, labels in second for label in labels.tolist()]
    second.close()
    assert sorted(label for label in seen if label >= 0) == list(range(24))
    with pytest.raises(FileNotFoundError, match=r"tf/missing: no such object") as missing:
        remote.head(presigned(http_store.url("tf/missing")))
    user_info = closed_endpoint().replace("://", f"://reader:{PASSWORD}@")  # nothing listens there
    with remote.options_in_force(remote.ClientOptions.of(attempts=2, timeout=1.0)):
        with pytest.raises(ConnectionError, match="cannot reach the HTTP endpoint") as unreachable:
            remote.head(presigned(f"{user_info}/folder/train-00000-of-00002"))
    assert any("trying again" in r.getMessage() for r in caplog.records)
    assert not leaks(error_text(missing.value)) and not leaks(error_text(unreachable.value))
    assert not leaks(ours(caplog))


def test_a_url_is_named_without_what_grants_access_and_requested_with_it():
    from dali_pipes.storage import redact
    url = "https://reader:pw@host.example/b/train-0.tar?sig=abc&token=def"
    name = remote_urls.identity(url)
    assert name == "https://host.example/b/train-0.tar" == str(remote_urls.RemoteUrl.parse(url))
    assert redact.with_access(name) == url
    assert remote_urls.identity("s3://bucket/train-?.tar") == "s3://bucket/train-?.tar"  # a glob, not a query
    scrubbed = redact.scrub(f"GET {url} failed")
    assert scrubbed == "GET https://<redacted>@host.example/b/train-0.tar?<redacted> failed" == redact.scrub(scrubbed)
    error = redact.clean(remote.UnreachableError(f"{url}: cannot reach it"))
    assert isinstance(error, remote.UnreachableError) and str(error) == redact.scrub(f"{url}: cannot reach it")


def test_worker_processes_request_a_url_with_what_grants_access():
    """verify's and convert's workers read remote images by their identity: a spawned worker (DALI is loaded here,
    so process_pool spawns) requests them with the access this process keeps."""
    from dali_pipes.storage import redact
    from dali_pipes.tools.workers import process_pool
    pytest.importorskip("nvidia.dali")  # loaded here: process_pool spawns its workers
    url = presigned("https://host.example/b/images/cat/000.jpg")
    name = remote_urls.identity(url)  # as verify lists the images before it starts its workers
    with process_pool(1) as pool:
        assert pool.submit(redact.with_access, name).result(timeout=120) == url


def test_an_azure_sas_or_account_key_is_in_no_error_or_log(azure, azurite_server, monkeypatch, caplog):
    """A SAS connection string put its signature into the endpoint every az:// error names."""
    caplog.set_level(logging.DEBUG, logger="dali_pipes")
    endpoint = f"{azurite_server.endpoint}/devstoreaccount1"
    sas = "sv=2022-11-02&ss=b&srt=sco&sp=rl&se=2030-01-01T00:00:00Z&sig=PlantedSasSignature0123456789%3D"
    key = base64.b64encode(b"PlantedAccountKey-" * 4).decode()
    errors = []
    for connection, secret in ((f"BlobEndpoint={endpoint};SharedAccessSignature={sas}", "PlantedSasSignature"),
                               (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={key};"
                                f"BlobEndpoint={endpoint};", key)):
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)
        with pytest.raises(PermissionError, match=azure.bucket) as refused:
            remote.list_objects(azure.url("tf/"))
        errors.append(error_text(refused.value))
        assert not leaks(errors[-1], [secret, "sig="]), errors[-1]
    assert not leaks(ours(caplog), ["PlantedSasSignature", key])


def test_hf_and_aws_keys_in_the_environment_are_in_no_state_error_or_report(s3, tmp_path, monkeypatch, caplog):
    from dali_pipes.tools import doctor

    from store_servers import HubMirror, Store, point_hf_at
    caplog.set_level(logging.DEBUG, logger="dali_pipes")
    monkeypatch.setenv("DALI_PIPES_CACHE", str(tmp_path / "cache"))
    planted = ["PlantedAwsSecretKey0123456789", SESSION_TOKEN, "hf_PlantedHubToken0123456789"]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", planted[0])  # moto takes any key
    monkeypatch.setenv("AWS_SESSION_TOKEN", planted[1])
    loader = DaliLoader(numbered_shards(s3.put), batch_size=8, train=False, **KW)
    next(iter(loader))
    texts = [pickle.dumps(loader.state_dict())]
    loader.close()
    with pytest.raises(FileNotFoundError) as missing:
        remote.head(s3.url("tf/missing"))
    texts.append(error_text(missing.value).encode())
    private = Store("hf", "datasets/org/private", "", tmp_path / "hub")
    numbered_shards(private.put)
    with HubMirror(str(tmp_path / "hub"), token=planted[2]) as server:
        point_hf_at(monkeypatch, server.endpoint, str(tmp_path / "hf-home"))
        monkeypatch.setenv("HF_TOKEN", planted[2])
        loader = DaliLoader(private.url("tf/"), batch_size=8, train=False, **KW)
        next(iter(loader))
        texts.append(pickle.dumps(loader.state_dict()))
        loader.close()
        monkeypatch.setenv("HF_TOKEN", planted[2] + "-expired")
        with pytest.raises(PermissionError, match="refused HF_TOKEN") as refused:
            remote.list_objects(private.url("tf/"))
        texts.append(error_text(refused.value).encode())
    report = doctor.write_results(str(tmp_path / "doctor"), doctor.environment(), [], [])
    texts += [open(path, "rb").read() for path in report]
    assert not [leaks(text, planted) for text in texts if leaks(text, planted)]
    assert not leaks(ours(caplog), planted)


def test_a_training_run_on_presigned_urls_writes_no_secret_in_its_workdir(http_store, tmp_path):
    """One run, stopped by SIGTERM after the first step of its second epoch (so it leaves metrics.jsonl, args.json,
    config.json, checkpoint.pt and preempted.json), with secrets in every credential variable: none of them in any
    file of the workdir or in its output; the checkpoint loads with torch.load(weights_only=True), nothing allowed
    beyond it. (Resuming under a fresh signature: the first test; --resume itself: tests/test_train.py.)"""
    import torch
    (shard,) = numbered_shards(http_store.put, n=8, shards=1)
    work = tmp_path / "run"
    secrets = {"AWS_SECRET_ACCESS_KEY": "PlantedAwsSecretKey0123456789", "AWS_SESSION_TOKEN": SESSION_TOKEN,
               "HF_TOKEN": "hf_PlantedHubToken0123456789",
               "AZURE_STORAGE_CONNECTION_STRING": "BlobEndpoint=http://127.0.0.1:9/a;SharedAccessSignature=sig=PlantedSas0"}
    planted = [*PLANTED, *secrets.values(), "PlantedSas0"]
    cmd = [sys.executable, "-m", "train", "--data", presigned(shard), "--num-classes", "8", "--device", "cpu",
           "--arch", "resnet10", "--width", "8", "--image-size", "16", "--batch-size", "4", "--epochs", "2",
           "--workdir", str(work), "--threads", "1", "--workers", "1", "--prefetch-queue-depth", "2",
           "--no-sharding-check"]
    stopped = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**os.environ, **secrets, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT,
                                  "DALI_PIPES_CACHE": str(tmp_path / "cache"), "DALI_PIPES_TEST_KILL_AT_STEP": "3",
                                  "DALI_PIPES_TEST_KILL_SIGNAL": "TERM"})
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert json.load(open(work / "preempted.json"))["step"] == 3
    assert [line["step"] for line in map(json.loads, open(work / "metrics.jsonl"))] == [2]
    files = {name: open(work / name, "rb").read() for name in os.listdir(work)}
    assert {"checkpoint.pt", "args.json", "config.json", "metrics.jsonl", "preempted.json"} <= set(files)
    assert not {name: leaks(data, planted) for name, data in files.items() if leaks(data, planted)}
    assert not leaks(stopped.stdout + stopped.stderr, planted)
    assert json.load(open(work / "args.json"))["data"] == shard  # its identity: the URL without its query
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(work / "checkpoint.pt")) == []
