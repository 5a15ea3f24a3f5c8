"""Where bytes live: local files (temp files, locks, the cache root), remote objects of every scheme (remote:
s3:// on boto3 in object_store, gs://, az://, hf://, http(s):// over fsspec in fs), and the bounded local
cache of remote shard files (shard_cache). Imports nothing above it."""
