"""Local servers for the storage benchmark (`dali-pipes bench s3`) and the tests: a latency and fault proxy and a
moto S3 server (latency_proxy.py), GCS and Azure emulators, an HTTP file server and a Hugging Face Hub mirror
(store_servers.py). Run from a checkout: pyproject.toml's package list leaves this folder out, so that
`pip install` puts no test or benchmark server into site-packages (tests/test_bench.py checks it)."""
