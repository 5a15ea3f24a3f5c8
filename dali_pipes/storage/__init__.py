"""Where bytes live: local files (temp files, locks, the cache root), s3:// objects (object_store), and the
bounded local cache of remote shard files (shard_cache). Imports nothing above it."""
