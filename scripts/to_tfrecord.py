"""Convert to TFRecord shards: `dali-pipes convert tfrecord SRC OUT [flags]`; with --decompress,
`dali-pipes convert decompress SRC OUT` (GZIP/ZLIB TFRecords rewritten uncompressed)."""

import sys

from dali_pipes.tools.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    kind = "decompress" if "--decompress" in args else "tfrecord"
    sys.exit(main(["convert", kind, *(a for a in args if a != "--decompress")]))
