"""Every Python and shell block of README.md and docs/*.md runs, as a newcomer would paste it.

A ```python, ```bash, ```sh or ```shell block is runnable unless the line right above its fence marks it:

    <!-- fragment: why it cannot run as written (an excerpt, ImageNet paths, hours of training, ...) -->
    <!-- gpu: why it needs a GPU -->          (run where torch sees CUDA, skipped with that reason elsewhere)

Runnable blocks run one by one, in page order, each in a process of its own, in one working directory per page
(so a page's later blocks see what its earlier ones wrote; a pytest-xdist worker first runs the page's earlier
blocks that another worker ran), where `data/sample/images` holds a small copy of the
built-in dataset (4 classes, 16 train and 8 val images each: the real sampler, made once per session). Python
blocks run as `python -c BLOCK`, shell blocks with `bash -e -o pipefail`; `python` and `dali-pipes` are this
interpreter and this checkout's command, `python -m train` is this checkout's loop. The caches are the page's
own (nothing is written to ~/.cache); torch computes on one thread (OMP_NUM_THREADS=1, as the other tests'
subprocesses do: the suite runs two at a time on two cores). Blocks with `s3://` URLs talk to a local S3 server
(moto on 127.0.0.1, tests/s3_server.py) holding the bucket `my-bucket`, through the standard AWS variables.
Blocks that import torchvision get the tests' side install of it (tests/torchvision_side.py), standing in for the
matching CPU torchvision that docs/drop-in.md says how to install. A block that exits non-zero fails its test,
with its output.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from test_docs import ROOT, _id, fenced_blocks

pytest_plugins = ["s3_server"]  # moto_endpoint, aws_empty_file: a local S3 server for s3:// blocks

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = {"python": "python", "bash": "shell", "sh": "shell", "shell": "shell"}
MARKER = re.compile(r"^\s*<!--\s*(fragment|gpu)\s*:?\s*(.*?)\s*-->\s*$")
BUCKET = "my-bucket"  # the bucket the docs' s3:// blocks write to and read from
TIMEOUT_S = 300  # one block; a loaded 2-core machine is slow, a hung one is not waited on forever


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    lang: str  # "python" or "shell"
    code: str
    mark: str  # "", "fragment" or "gpu"
    why: str  # the marker's reason

    @property
    def id(self) -> str:
        name = _id(self.page) if self.page.is_relative_to(ROOT) else self.page.name
        return f"{name}:{self.line}"


def blocks_of(page: Path, text: str | None = None) -> list[Block]:
    """The Python and shell blocks of a page, each with the marker on the line above its fence."""
    text = page.read_text() if text is None else text
    lines = text.splitlines()
    found = []
    for lang, start, body in fenced_blocks(text):
        if lang not in RUNNABLE:
            continue
        above = MARKER.match(lines[start - 2]) if start >= 2 else None
        code = textwrap.dedent("\n".join(body)) + "\n"  # a block inside a list item is indented
        found.append(Block(page, start, RUNNABLE[lang], code, above.group(1) if above else "",
                           above.group(2) if above else ""))
    return found


ALL = [block for page in PAGES for block in blocks_of(page)]


# ---------------------------------------------------------------------------------------------
# Where blocks run: the built-in data, a page's working directory, the environment
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def sample_images(tmp_path_factory) -> Path:
    """A small built-in dataset (the real sampler's photographs): ROOT/train/<class>/*.jpg, ROOT/val/..."""
    from dali_pipes.tools.sample_data import SampleDatasetConfig, make_sample_dataset
    root = tmp_path_factory.mktemp("docs-sample") / "images"
    make_sample_dataset(str(root), SampleDatasetConfig(classes=4, train_per_class=16, val_per_class=8,
                                                       min_side=160, max_side=320), workers=2, progress=False)
    return root


@pytest.fixture(scope="session")
def shims(tmp_path_factory) -> Path:
    """bin/: `python`, `python3` and `dali-pipes` of this interpreter and checkout, first on the PATH."""
    bin_dir = tmp_path_factory.mktemp("docs-bin")
    commands = {"python": '"$@"', "python3": '"$@"', "dali-pipes": '-m dali_pipes "$@"'}
    for name, args in commands.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" {args}\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


_workdirs: dict[Path, Path] = {}


def workdir(page: Path, sample_images: Path, tmp_path_factory) -> Path:
    """The page's working directory (one per page and session): data/sample/images, hard-linked from the
    session's copy (cheap, and a block that writes there changes only its page's files)."""
    if page not in _workdirs:
        where = tmp_path_factory.mktemp(f"docs-{page.stem}")
        shutil.copytree(sample_images, where / "data" / "sample" / "images", copy_function=os.link)
        _workdirs[page] = where
    return _workdirs[page]


def torchvision_site(folder: Path) -> Path:
    """A sitecustomize.py that makes the side install importable as `torchvision`, as a CPU wheel would be."""
    from torchvision_side import STUBBED, side_folder, torchvision_version
    site = folder / "torchvision-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import sys, types\n"
        f"sys.path.append({side_folder(torchvision_version())!r})\n"
        f"for name in {STUBBED!r}:\n"
        "    sys.modules.setdefault(name, types.ModuleType(name))\n")
    return site


def environment(where: Path, shims: Path, extra_path: list[Path]) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT), *map(str, extra_path), *filter(None, [env.get("PYTHONPATH")])]
    env.update(PATH=f"{shims}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=os.pathsep.join(paths),
               DALI_PIPES_CACHE=str(where / "cache"), HF_HOME=str(where / "hf"), HF_HUB_OFFLINE="1",
               TQDM_DISABLE="1", MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1",
               OMP_NUM_THREADS="1")  # torch's own threads: 2 per block, 2 blocks at once on 2 cores spun idle
    return env


def point_at_s3(env: dict[str, str], endpoint: str, empty_file: str) -> None:
    """The AWS chain of the block: the local server, fake keys; the bucket made once."""
    from s3_server import CLEARED_VARIABLES, REGION, admin_client
    for name in CLEARED_VARIABLES:
        env.pop(name, None)
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_REGION=REGION, AWS_DEFAULT_REGION=REGION, AWS_CONFIG_FILE=empty_file,
               AWS_SHARED_CREDENTIALS_FILE=empty_file, AWS_EC2_METADATA_DISABLED="true", NO_PROXY="127.0.0.1")
    client = admin_client(endpoint)
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    argv = ([sys.executable, "-c", block.code] if block.lang == "python"
            else ["bash", "-e", "-o", "pipefail", "-c", block.code])
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def failure(block: Block, done: subprocess.CompletedProcess) -> str:
    numbered = "\n".join(f"{n:4d}  {line}" for n, line in enumerate(block.code.splitlines(), 1))
    output = (done.stdout + done.stderr).strip().splitlines()
    return (f"{block.id}: the {block.lang} block exited {done.returncode}\n{numbered}\n--- its output (last 40 "
            f"lines) ---\n" + "\n".join(output[-40:]) + "\n(mark it <!-- fragment: why --> if it cannot run)")


# ---------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------

_ran: set[Block] = set()  # the blocks run in this process


def runs_here(block: Block) -> bool:
    return not block.mark or (block.mark == "gpu" and torch.cuda.is_available())


def run_in_page(block: Block, request, where: Path, shims: Path) -> None:
    extra = []
    if re.search(r"^\s*(import|from)\s+torchvision\b", block.code, re.M):
        request.getfixturevalue("torchvision")  # the side install, or a skip saying why it cannot be had
        extra.append(torchvision_site(where))
    env = environment(where, shims, extra)
    if "s3://" in block.code:
        point_at_s3(env, request.getfixturevalue("moto_endpoint"), request.getfixturevalue("aws_empty_file"))
    done = run_block(block, where, env)
    _ran.add(block)
    if done.returncode != 0:
        pytest.fail(failure(block, done), pytrace=False)


@pytest.mark.parametrize("block", ALL, ids=[b.id for b in ALL])
def test_the_block_runs(block, request, sample_images, shims, tmp_path_factory):
    if block.mark == "fragment":
        pytest.skip(f"fragment: {block.why}")
    if block.mark == "gpu" and not torch.cuda.is_available():
        pytest.skip(f"needs a GPU: {block.why}")
    where = workdir(block.page, sample_images, tmp_path_factory)
    # pytest -n 2 may give a page's blocks to two processes (or -k pick one): the page's earlier blocks that
    # did not run here run first, in page order, as the reader ran them before this one
    for earlier in [b for b in ALL if b.page == block.page and b.line < block.line and runs_here(b)]:
        if earlier not in _ran:
            run_in_page(earlier, request, where, shims)
    run_in_page(block, request, where, shims)


def test_every_marker_sits_on_a_block_and_says_why():
    problems = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        marked = {b.line - 1 for b in blocks_of(page) if b.mark}
        for number, line in enumerate(lines, 1):
            match = MARKER.match(line)
            if match and number not in marked:
                problems.append(f"{_id(page)}:{number}: a marker not on the line above a python/bash block")
            elif match and not match.group(2):
                problems.append(f"{_id(page)}:{number}: a marker without its reason")
    assert not problems, "\n".join(problems)


def test_most_blocks_run_and_each_kind_is_there():
    """Not vacuous: blocks of both languages run, and fragments stay the exception."""
    runnable = [b for b in ALL if not b.mark]
    assert {b.lang for b in runnable} == {"python", "shell"}
    assert len(runnable) >= 12, [b.id for b in runnable]
    assert any(b.mark == "gpu" for b in ALL)


def test_a_broken_block_fails_with_its_line_and_output(tmp_path, shims):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```python\nprint('fine')\n```\n\n<!-- fragment: an excerpt -->\n```python\n"
                    "undefined_name\n```\n\n```bash\ndali-pipes verify no/such/folder\n```\n")
    first, fragment, shell = blocks_of(page)
    assert (first.mark, fragment.mark, fragment.why, shell.lang) == ("", "fragment", "an excerpt", "shell")
    env = environment(tmp_path, shims, [])
    assert run_block(first, tmp_path, env).returncode == 0
    broken = run_block(fragment, tmp_path, env)
    assert broken.returncode != 0 and "NameError: name 'undefined_name' is not defined" in failure(fragment, broken)
    refused = run_block(shell, tmp_path, env)
    assert refused.returncode == 1 and "no/such/folder" in failure(shell, refused)
