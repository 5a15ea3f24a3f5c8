"""A real S3 API on 127.0.0.1 for tests: moto's server in a child process, spoken to over HTTP.

The server runs as a process (`LocalS3Server`), not a thread of the test process: DALI's S3 reader
holds the GIL while it waits on the network (pipeline build sends HEADs), so an in-process Python
server would never answer it. Test modules load the fixtures as a plugin:

    pytest_plugins = ["s3_server"]

    def test_something(s3):
        s3.put("train/a.tfrecord", b"...")
        assert list_objects(s3.url("train/")) ...

`s3` points the whole AWS chain of the test (boto3 and DALI alike) at the server, with fake
credentials, no ~/.aws files and no EC2 metadata lookups, so no test can reach another address.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import socket
from dataclasses import dataclass
from typing import Iterator

import pytest

from dali_pipes_bench.servers.latency_proxy import LatencyProxy
from dali_pipes_bench.servers.latency_proxy import LocalS3Server as MotoServer

HOST = "127.0.0.1"
REGION = "us-east-1"

# Everything in the AWS chain that could point boto3 or DALI elsewhere than the test server.
CLEARED_VARIABLES = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                     "AWS_ENDPOINT_URL_S3", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                     "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                     "AWS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")


def closed_endpoint() -> str:
    """http://127.0.0.1:PORT where nothing listens: a port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def point_aws_at(monkeypatch: pytest.MonkeyPatch, endpoint: str, empty_file: str) -> None:
    """The AWS chain of this test: `endpoint`, fake keys, a region, empty config files, no IMDS."""
    for name in CLEARED_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", empty_file)  # the developer's ~/.aws stays out of tests
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", empty_file)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no 169.254.169.254 lookups, boto3 or DALI
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("NO_PROXY", HOST)


def keep_s3_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries and timeouts a test sets (remote.configure, the process's default) end with it."""
    from dali_pipes.storage import remote
    monkeypatch.setattr(remote, "_default_options", remote.current_options())


@dataclass
class S3Bucket:
    """One empty bucket on the test server, and the boto3 client the test environment makes."""
    endpoint: str
    bucket: str
    client: object

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        return self.url(key)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)


_bucket_numbers = itertools.count()


@functools.lru_cache(maxsize=4)
def admin_client(endpoint: str):
    """A client with explicit settings, independent of the test's AWS environment (made once:
    a boto3 client takes a good part of a second to make on a busy 2-core machine)."""
    import boto3
    return boto3.session.Session().client("s3", endpoint_url=endpoint, region_name=REGION,
                                          aws_access_key_id="testing", aws_secret_access_key="testing")


def make_bucket(endpoint: str) -> S3Bucket:
    """A fresh bucket (unique per test: one server serves the whole session) and a plain client."""
    client = admin_client(endpoint)
    name = f"bucket-{os.getpid()}-{next(_bucket_numbers)}"
    client.create_bucket(Bucket=name)
    return S3Bucket(endpoint, name, client)


@pytest.fixture(scope="session")
def moto_endpoint():
    """http://127.0.0.1:PORT of one moto server for the whole session, stopped at its end."""
    with MotoServer() as server:
        yield server.endpoint


@pytest.fixture(scope="session")
def aws_empty_file(tmp_path_factory) -> str:
    """An empty file for AWS_CONFIG_FILE and AWS_SHARED_CREDENTIALS_FILE (outside tests' tmp_path)."""
    path = tmp_path_factory.mktemp("aws") / "empty"
    path.write_text("")
    return str(path)


@pytest.fixture
def s3(moto_endpoint, monkeypatch, aws_empty_file) -> S3Bucket:
    """An empty bucket, with the test's AWS environment pointed at the server."""
    point_aws_at(monkeypatch, moto_endpoint, aws_empty_file)
    keep_s3_options(monkeypatch)
    return make_bucket(moto_endpoint)


@pytest.fixture
def proxy(s3, moto_endpoint, monkeypatch, aws_empty_file):
    """A LatencyProxy (no delay) in front of the server, in this process, with the AWS
    environment pointed at the proxy: tests add faults to it and read its request counts."""
    with LatencyProxy(moto_endpoint, delay_ms=0) as running:
        point_aws_at(monkeypatch, running.url, aws_empty_file)
        yield running


@dataclass
class RestrictedReader:
    """A server that checks IAM, with one object, and keys of a user allowed only s3:ListBucket."""
    endpoint: str
    bucket: str
    key: str
    access_key_id: str
    secret_access_key: str


@pytest.fixture
def restricted_s3(monkeypatch, aws_empty_file) -> Iterator[RestrictedReader]:
    """A server of its own with IAM enforced; the test's AWS chain points at it with the keys of
    a user who may list the bucket but not read its object (real 403 AccessDenied replies)."""
    with restricted_reader() as server:
        point_aws_at(monkeypatch, server.endpoint, aws_empty_file)
        keep_s3_options(monkeypatch)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_access_key)
        yield server


@contextlib.contextmanager
def restricted_reader() -> Iterator[RestrictedReader]:
    """A second moto server with IAM enforced, for real 403 AccessDenied replies. moto enforces IAM
    after INITIAL_NO_AUTH_ACTION_COUNT unauthenticated calls: the five setup calls below."""
    import boto3
    with MotoServer(env={"INITIAL_NO_AUTH_ACTION_COUNT": "5"}) as server:
        admin = dict(endpoint_url=server.endpoint, region_name=REGION, aws_access_key_id="testing",
                     aws_secret_access_key="testing")
        s3_admin, iam = boto3.client("s3", **admin), boto3.client("iam", **admin)
        s3_admin.create_bucket(Bucket="restricted")
        s3_admin.put_object(Bucket="restricted", Key="train/a.tfrecord", Body=b"secret")
        iam.create_user(UserName="reader")
        policy = {"Version": "2012-10-17",
                  "Statement": [{"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": "*"}]}
        iam.put_user_policy(UserName="reader", PolicyName="list-only", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        yield RestrictedReader(server.endpoint, "restricted", "train/a.tfrecord", key["AccessKeyId"],
                               key["SecretAccessKey"])
