"""Object-store feed benchmark: the same TFRecord shards read from local disk, by DALI's native
s3:// reader, and through the shard cache, with a round-trip delay between loader and store.

    python -m dali_pipes_bench.s3_feed [--scheme s3|gs|az|http|hf] [--delay-ms 20] [--ranks 1 2] [--images 1536]

A local server of the scheme (moto for s3, gcp-storage-emulator for gs, Azurite for az, a Range-capable
HTTP file server for http, a Hugging Face Hub mirror for hf: servers/store_servers.py; each in a process) holds the
shards; a LatencyProxy process in front of it waits `delay_ms` before forwarding each request. Every case
runs each rank as a fresh process, all ranks at once, through the same decode + resize + crop graph (DALI CPU
operators), and reads the rank's DALI shard (shard_id = rank) in storage order:
  * local:  fn.readers.tfrecord over local files;
  * native: the same reader over s3:// URLs (DALI's AWS SDK, one ranged GET per record; s3 only here);
  * cache:  the same reader over ShardCache files, whole shards fetched ahead (ReadAheadGate).
Reported per case: images/s over all ranks (images after each rank's first batch / the slowest
rank's time), the first-batch latency, requests seen by the proxy, and the ratio to local at the
same rank count. Prints a table of the cases (each case a tick of a bar on stderr) and where the results went:
one JSON line per case and per summary, appended to --out, default s3.jsonl in a folder of this run's own under
$DALI_PIPES_CACHE/bench.

The servers (dali_pipes_bench/servers/) are not installed with dali_pipes: run this from a checkout.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from types import ModuleType

import numpy as np

from dali_pipes_bench.cli import bar, markdown, results_file, run_main

CASES = ("local", "native", "cache")
LABELS = 10
BUCKET = "bench"
HF_REPO = "datasets/bench/feed"  # hf://'s "bucket": a dataset repository on the Hub mirror


# ---------------------------------------------------------------------------------------------
# Data: smooth JPEGs of ImageNet-like sizes, dealt into TFRecord shards with local indexes
# ---------------------------------------------------------------------------------------------

def make_jpeg(rng: np.random.Generator) -> bytes:
    """A ~400x300 JPEG of low-frequency colour noise: decodes like a photo, compresses like one."""
    from PIL import Image
    height, width = int(rng.integers(280, 380)), int(rng.integers(360, 500))
    coarse = rng.integers(0, 256, (height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.BICUBIC)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


def write_shards(folder: str, images: int, shards: int) -> list[dict]:
    """shards TFRecord files (image i -> shard i % shards, label i % LABELS) and their .idx files."""
    from dali_pipes.data.formats import tfrecord
    rng = np.random.default_rng(0)
    records: list[list[bytes]] = [[] for _ in range(shards)]
    for i in range(images):
        example = tfrecord.encode_example({"image/encoded": make_jpeg(rng), "image/class/label": i % LABELS})
        records[i % shards].append(tfrecord.frame_record(example))
    out = []
    for s, framed in enumerate(records):
        path = os.path.join(folder, f"train-{s:05d}-of-{shards:05d}")
        with open(path, "wb") as f:
            f.write(b"".join(framed))
        tfrecord.write_tfrecord_index(tfrecord.build_tfrecord_index(path), path + ".idx")
        out.append({"path": path, "index": path + ".idx", "count": len(framed), "bytes": os.path.getsize(path)})
    return out


# ---------------------------------------------------------------------------------------------
# One rank of one case (a worker process)
# ---------------------------------------------------------------------------------------------

def build_pipe(paths: list[str], indexes: list[str], rank: int, world: int, batch: int, threads: int):
    """The benchmark graph over `paths`: read this rank's shard in order, decode, resize, crop."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali import tfrecord as tfrec

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, prefetch_queue_depth=2)
    def pipe():
        out = fn.readers.tfrecord(path=paths, index_path=indexes, name="Reader", shard_id=rank, num_shards=world,
                                  stick_to_shard=True, random_shuffle=False, prefetch_queue_depth=1,
                                  features={"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                                            "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
        images = fn.decoders.image(out["image/encoded"], device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_shorter=256)
        images = fn.crop_mirror_normalize(images, crop=(224, 224), dtype=types.FLOAT, output_layout="CHW")
        return images, out["image/class/label"]

    return pipe()




def run_worker(args: argparse.Namespace) -> dict:
    """Read `batches` batches of this rank's shard; images/s counted after the first batch."""
    if args.cpus:  # before DALI starts a thread: every thread of the rank stays on these cores
        os.sched_setaffinity(0, args.cpus)
    from dali_pipes.data.reader import ReaderModel
    from dali_pipes.storage import remote
    from dali_pipes.storage.shard_cache import ReadAheadGate, ShardCache
    with open(args.manifest) as f:
        manifest = json.load(f)
    shards = manifest["shards"]
    indexes = [s["index"] for s in shards]
    counts = [s["count"] for s in shards]
    reader = ReaderModel(sum(counts), args.rank, args.world, batch_size=args.batch_size)  # val: no shuffle buffer
    taken = reader.files_of(counts, args.rank)
    steps = min(args.batches, args.epochs * sum(n for _, n in taken) // args.batch_size)
    start = time.monotonic()
    cache = gate = None
    if args.case == "local":
        paths = [s["path"] for s in shards]
    elif args.case == "native":
        paths = [s["url"] for s in shards]
    else:
        infos = _listed(args.scheme, [s["url"] for s in shards], remote)  # through the proxy, as a job would
        cache = ShardCache(folder=args.cache_folder, max_bytes=args.cache_bytes, prefetch=args.prefetch)
        cache.extend([infos[i] for i, _ in taken] * (args.epochs + 1))  # +1: the reader reads on past the end
        gate = ReadAheadGate(cache, [n for _, n in taken] * (args.epochs + 1), reader.read_ahead)
        gate.advance(0)
        paths = [cache.path_for(info) for info in infos]
    threads = max(1, len(os.sched_getaffinity(0)) // args.world)
    pipe = build_pipe(paths, indexes, args.rank, args.world, args.batch_size, threads)
    pipe.build()
    pipe.run()
    first_batch_s = time.monotonic() - start
    timed_start, cpu_start = time.monotonic(), time.process_time()
    for step in range(1, steps):
        if gate is not None:
            gate.advance(step * args.batch_size)
        pipe.run()
    seconds = time.monotonic() - timed_start
    # cpu_s: every thread of the rank (DALI's and the cache's downloads): what the cache costs on a busy host
    result = {"rank": args.rank, "images": (steps - 1) * args.batch_size, "seconds": seconds,
              "first_batch_s": first_batch_s, "cpu_s": round(time.process_time() - cpu_start, 2)}
    if cache is not None:
        result["cache"] = cache.stats()
        cache.close()
    del pipe
    return result


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------

def _listed(scheme: str, urls: list[str], remote) -> list:
    """The shards' infos as a job gets them: a listing of the glob, or a HEAD of each URL (http)."""
    from dali_pipes.storage.remote_urls import SCHEMES
    if not SCHEMES[scheme].listing:
        return remote.heads(urls)
    return remote.list_objects(f"{scheme}://{_bucket(scheme)}/train/train-*")


def _bucket(scheme: str) -> str:
    return HF_REPO if scheme == "hf" else BUCKET


def scheme_environment(scheme: str, proxy_url: str, config_file: str, server) -> dict[str, str]:
    """The workers' environment: the scheme's chain pointed at the proxy, nothing else reachable."""
    env = aws_environment(proxy_url, config_file)
    if scheme == "gs":
        env["STORAGE_EMULATOR_HOST"] = proxy_url
    elif scheme == "az":
        env["AZURE_STORAGE_CONNECTION_STRING"] = server.connection_string(proxy_url)
    elif scheme == "hf":  # the mirror is public: no token, and none read from a stored login
        env = {k: v for k, v in env.items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE")}
        env.update(HF_ENDPOINT=proxy_url, HF_HOME=os.path.join(os.path.dirname(config_file), "hf-home"),
                   HF_HUB_DISABLE_TELEMETRY="1")
    return env


def aws_environment(endpoint: str, config_file: str) -> dict[str, str]:
    """The AWS chain of the workers: the proxy, fake keys, no ~/.aws files, no EC2 metadata lookups."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
               AWS_DEFAULT_REGION="us-east-1", AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
               AWS_CONFIG_FILE=config_file, AWS_SHARED_CREDENTIALS_FILE=config_file, NO_PROXY="127.0.0.1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return env


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_case(case: str, world: int, args: argparse.Namespace, manifest: str, env: dict, proxy,
             store_pids: list[int]) -> dict:
    """All ranks of one case at once, each a fresh process; their results merged into one row.
    store_cpu_s: CPU the local store and the proxy used meanwhile (on a real store, not ours)."""
    batches = args.native_batches if case == "native" else args.batches
    before = proxy.stats()
    store_before = sum(process_cpu_s(pid) for pid in store_pids)
    command = [sys.executable, "-m", "dali_pipes_bench.s3_feed", "--worker", "--scheme", args.scheme, "--case", case,
               "--world", str(world),
               "--manifest", manifest, "--batch-size", str(args.batch_size), "--batches", str(batches),
               "--epochs", str(args.epochs), "--cache-folder", args.cache_folder,
               "--cache-bytes", str(args.cache_bytes), "--prefetch", str(args.prefetch)]
    command += ["--cpus", *map(str, args.cpus)] if args.cpus else []
    workers = [subprocess.Popen(command + ["--rank", str(r)], stdout=subprocess.PIPE, text=True, env=env)
               for r in range(world)]
    outputs = [w.communicate(timeout=args.timeout)[0] for w in workers]
    if any(w.returncode for w in workers):
        return {"case": case, "world_size": world, "error": f"worker exit codes {[w.returncode for w in workers]}"}
    ranks = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    after = proxy.stats()
    store_cpu_s = sum(process_cpu_s(pid) for pid in store_pids) - store_before
    images = sum(r["images"] for r in ranks)
    return {"case": case, "world_size": world, "delay_ms": args.delay_ms, "batch_size": args.batch_size,
            "images": images, "images_per_s": images / max(r["seconds"] for r in ranks),
            "first_batch_s": max(r["first_batch_s"] for r in ranks), "cpu_s": [r["cpu_s"] for r in ranks],
            "requests": {k: after.get(k, 0) - before.get(k, 0) for k in after}, "store_cpu_s": round(store_cpu_s, 2),
            "cache": [r.get("cache") for r in ranks] if case == "cache" else None}


def servers() -> ModuleType:
    """dali_pipes_bench.servers (a checkout's; `pip install` leaves the servers out), or an ImportError that says so."""
    try:
        import dali_pipes_bench.servers.latency_proxy
        import dali_pipes_bench.servers.store_servers  # noqa: F401  (both: the modules it needs)
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("dali_pipes_bench.servers"):
            raise
        raise ImportError("dali-pipes bench s3: its local servers (dali_pipes_bench/servers/: moto, the emulators, "
                          "the latency proxy) are not installed with dali_pipes; run it from a checkout: git clone the "
                          "dali_pipes repository, then in it: python -m dali_pipes_bench.s3_feed [flags]") from None
    return dali_pipes_bench.servers


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(args)), flush=True)
        return 0
    proxy_process = servers().latency_proxy.ProxyProcess
    with tempfile.TemporaryDirectory(prefix="s3_feed-") as work:
        args.cache_folder = args.cache_folder or os.path.join(work, "cache")
        shards = write_shards(work, args.images, args.shards)
        config_file = os.path.join(work, "aws-empty")
        open(config_file, "w").close()
        if args.store_cpus:  # the store and the proxy inherit these cores; the ranks take the rest
            args.cpus = sorted(os.sched_getaffinity(0) - set(args.store_cpus))
            if not args.cpus:
                raise SystemExit(f"--store-cpus {args.store_cpus} leaves no core to the ranks")
            os.sched_setaffinity(0, args.store_cpus)
        with _server(args.scheme, work) as server, proxy_process(server.endpoint, args.delay_ms) as proxy:
            _upload(args.scheme, server, shards, proxy.url)
            manifest = os.path.join(work, "manifest.json")
            with open(manifest, "w") as f:
                json.dump({"shards": shards}, f)
            env = scheme_environment(args.scheme, proxy.url, config_file, server)
            pids = [server.pid, proxy.pid]
            matrix = [(world, case) for _ in range(args.repeats) for world in args.ranks for case in args.cases]
            rows = [run_case(case, world, args, manifest, env, proxy, pids)
                    for world, case in bar(matrix, desc="cases", unit="case")]
    report(rows, args)
    return 0


def _server(scheme: str, work: str):
    store_servers = servers().store_servers
    if scheme == "gs":
        return store_servers.GcsEmulator()
    if scheme == "az":
        return store_servers.Azurite()
    if scheme == "http":
        return store_servers.HttpFileServer(os.path.join(work, "http"))
    if scheme == "hf":
        return store_servers.HubMirror(os.path.join(work, "hub"))
    return servers().latency_proxy.LocalS3Server()


def _upload(scheme: str, server, shards: list[dict], proxy_url: str) -> None:
    """The shards onto the server directly (not through the delay); their URLs (through the proxy for http)."""
    if scheme == "s3":
        return upload(server.endpoint, shards)
    for shard in shards:
        key = f"train/{os.path.basename(shard['path'])}"
        if scheme in ("http", "hf"):  # served folders: the file is linked into place
            folder = server.folder(HF_REPO) if scheme == "hf" else os.path.join(server.root, BUCKET)
            os.makedirs(os.path.join(folder, "train"), exist_ok=True)
            os.link(shard["path"], os.path.join(folder, key))
        shard["url"] = f"{proxy_url}/{BUCKET}/{key}" if scheme == "http" else f"{scheme}://{_bucket(scheme)}/{key}"
    if scheme in ("http", "hf"):
        return
    admin = _admin_fs(scheme, server)
    admin.mkdir(BUCKET)
    for shard in shards:
        admin.put_file(shard["path"], f"{BUCKET}/train/{os.path.basename(shard['path'])}")


def _admin_fs(scheme: str, server):
    if scheme == "gs":
        os.environ["STORAGE_EMULATOR_HOST"] = server.endpoint  # this driver process only
        from gcsfs.core import GCSFileSystem
        return GCSFileSystem(token="anon", skip_instance_cache=True)
    from adlfs import AzureBlobFileSystem
    return AzureBlobFileSystem(connection_string=server.connection_string(), skip_instance_cache=True)


def upload(endpoint: str, shards: list[dict]) -> None:
    """Put the shards on the server directly (not through the delay) and note their URLs."""
    import boto3
    client = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                            aws_access_key_id="bench", aws_secret_access_key="bench")
    client.create_bucket(Bucket=BUCKET)
    for shard in shards:
        key = f"train/{os.path.basename(shard['path'])}"
        client.upload_file(shard["path"], BUCKET, key)
        shard["url"] = f"s3://{BUCKET}/{key}"


def summarise(rows: list[dict]) -> list[dict]:
    """Per (case, world size): median images/s over the repeats, and its ratio to local's median."""
    groups: dict[tuple[str, int], list[float]] = {}
    for row in rows:
        if row.get("images_per_s"):
            groups.setdefault((row["case"], row["world_size"]), []).append(row["images_per_s"])
    medians = {key: float(np.median(values)) for key, values in groups.items()}
    return [{"summary": case, "world_size": world, "median_images_per_s": round(median, 1),
             "runs": [round(v, 1) for v in groups[(case, world)]],
             "ratio_to_local": round(median / medians[("local", world)], 3) if ("local", world) in medians else None}
            for (case, world), median in medians.items()]


def report(rows: list[dict], args: argparse.Namespace) -> None:
    """A table of each case's summary (and any failed run), then each case's row and the summaries as one JSON
    line each, appended to --out (default: a file of this run's own under the cache root); where they went."""
    options = {k: v for k, v in vars(args).items() if k not in ("worker", "case", "rank", "world", "manifest")}
    summaries = summarise(rows)
    ratio = lambda r: "-" if r is None else f"{r:.3f}x"
    print(markdown(["case", "ranks", "images/s median", "runs", "vs local"],
                   [(s["summary"], s["world_size"], f"{s['median_images_per_s']:.0f}", s["runs"],
                     ratio(s["ratio_to_local"])) for s in summaries]))
    for row in rows:
        if row.get("error"):
            print(f"{row['case']}, {row['world_size']} ranks: failed: {str(row['error'])[:200]}")
    path = results_file(args.out, "s3", "s3.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.writelines(json.dumps({**row, "scheme": args.scheme, "args": options}) + "\n" for row in rows + summaries)
    print(f"results in {path}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from dali_pipes.storage.shard_cache import DEFAULT_MAX_BYTES, DEFAULT_PREFETCH
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scheme", choices=["s3", "gs", "az", "http", "hf"], default="s3",
                        help="the store: moto (s3), gcp-storage-emulator (gs), Azurite (az), an HTTP file server "
                             "(http), a Hugging Face Hub mirror (hf)")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="added before each request to the store")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="rank counts to run")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--images", type=int, default=1536, help="JPEGs in the data set")
    parser.add_argument("--shards", type=int, default=24, help="TFRecord shards they are dealt into")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2, help="epochs read per rank (local, cache)")
    parser.add_argument("--batches", type=int, default=10 ** 9, help="cap on batches per rank (local, cache)")
    parser.add_argument("--native-batches", type=int, default=6, help="batches per rank for native s3:// "
                                                                      "(it is slow: one GET per record)")
    parser.add_argument("--cache-bytes", type=int, default=DEFAULT_MAX_BYTES)
    parser.add_argument("--prefetch", type=int, default=DEFAULT_PREFETCH)
    parser.add_argument("--cache-folder", default="", help="default: inside the run's temporary folder")
    parser.add_argument("--repeats", type=int, default=1, help="runs of the whole matrix, interleaved")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per case before giving up")
    parser.add_argument("--store-cpus", type=int, nargs="+", default=[],
                        help="run the store and the proxy on these cores and the ranks on the others, as a store on "
                             "another machine would (default: all share every core, and the store's CPU counts "
                             "against the cache case)")
    parser.add_argument("--out", default="", help="append one JSON line per case to this file (default: s3.jsonl in "
                        "a folder of this run's own under $DALI_PIPES_CACHE/bench)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--manifest", help=argparse.SUPPRESS)
    parser.add_argument("--cpus", type=int, nargs="+", default=[], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(run_main(main))
