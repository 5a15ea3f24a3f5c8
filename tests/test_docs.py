"""The docs are checked like code: README.md, CHANGELOG.md and docs/*.md.

- Every relative link points to a file that exists, and a `#anchor` to a heading there (GitHub's slugs).
- Every command of this project in a bash/sh/console block (`python -m train`, `torchrun ... -m train`,
  `dali-pipes ...`, `python -m dali_pipes[.doctor]`, `python -m dali_pipes_bench.NAME`) parses with the
  project's own argument parser. Nothing runs here: parsing stops as soon as a parser has accepted its arguments
  (tests/test_docs_run.py runs the blocks themselves).
- Every test id (`tests/test_x.py::test_name`) names a test that exists.
- docs/layout.md names every module; the README stays a guide (at most 250 lines) whose Quickstart holds the
  line `.ci/run` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
INLINE_LINK = re.compile(r'!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')  # [text](target "title")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")  # [label]: target
OUR_MODULES = ("train", "dali_pipes", "dali_pipes.tools.cli", "dali_pipes.doctor")  # and dali_pipes_bench.*


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ---------------------------------------------------------------------------------------------
# Reading Markdown: fenced blocks, prose, headings, links
# ---------------------------------------------------------------------------------------------

def fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(language, line number of the opening fence, lines) of every fenced code block."""
    blocks, current, fence = [], None, ""
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if current is None and match:
            fence, current = match.group(1), (match.group(2).lower(), number, [])
        elif current is not None and line.strip().startswith(fence) and not line.strip().strip(fence[0]):
            blocks.append(current)
            current = None
        elif current is not None:
            current[2].append(line)
    return blocks


def fenced_line_numbers(text: str) -> set[int]:
    """The numbers of the lines that belong to fenced blocks, fences included."""
    return {n for _, start, lines in fenced_blocks(text) for n in range(start, start + len(lines) + 2)}


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced blocks, with inline code spans blanked out."""
    inside = fenced_line_numbers(text)
    return [(n, re.sub(r"(`+).+?\1", "", line)) for n, line in enumerate(text.splitlines(), 1) if n not in inside]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation but '-' and '_' dropped, spaces -> '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts as its text
    return re.sub(r"[^\w\- ]", "", text.replace("`", "").strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in `path`; a repeated heading gets -1, -2, ... as on GitHub."""
    text = path.read_text()
    inside = fenced_line_numbers(text)
    found, seen = set(), {}
    for number, line in enumerate(text.splitlines(), 1):
        match = None if number in inside else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline link or image and every reference definition."""
    found = []
    for number, line in prose_lines(text):
        found += [(number, m.group(1)) for m in INLINE_LINK.finditer(line)]
        found += [(number, m.group(1)) for m in REFERENCE_LINK.finditer(line)]
    return found


def broken_link(doc: Path, target: str) -> str | None:
    """Why `target`, linked from `doc`, leads nowhere; None when it resolves (or is not a relative link)."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//", target):
        return None  # http(s), mailto: not checked here (no network in tests)
    path_part, _, anchor = target.partition("#")
    path = (doc.parent / path_part).resolve() if path_part else doc
    if not path.exists():
        return f"{target}: no such file {path}"
    if anchor and path.suffix == ".md" and anchor not in anchors(path):
        return f"{target}: no heading with anchor #{anchor} in {_id(path)}"
    return None


# ---------------------------------------------------------------------------------------------
# Commands: the logical lines of shell blocks, and which of our parsers each one goes to
# ---------------------------------------------------------------------------------------------

def command_lines(lang: str, lines: list[str]) -> list[str]:
    """A shell block's commands: continuations joined; in a console block only the `$ ` lines."""
    if lang == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    joined, pending = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
        else:
            joined.append(pending + line)
            pending = ""
    return [line for line in joined + ([pending] if pending else []) if line.strip()]


def segments(line: str) -> list[list[str]]:
    """The simple commands of a line (split at && || ; | &), comments dropped, leading VAR=value dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    for token in lexer:
        if set(token) <= set(";&|"):
            out.append([])
        elif out[-1] or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", token):
            out[-1].append(token)
    return [seg for seg in out if seg]


def our_command(argv: list[str]) -> tuple[str, list[str]] | None:
    """(module, its arguments) when `argv` runs a command of this project; None for anything else."""
    head = argv[0]
    if head == "dali-pipes":
        return "dali_pipes", argv[1:]
    if re.search(r"(^|/)python(3(\.\d+)?)?$", head) and len(argv) > 2 and argv[1] == "-m":
        module = argv[2]
        if module in OUR_MODULES or module.startswith("dali_pipes_bench."):
            return module, argv[3:]
    if head == "torchrun":  # torchrun's own flags are checked by its own parser; then -m MODULE ARGS
        from torch.distributed.run import get_args_parser as torchrun_parser
        args = parsed(lambda a: torchrun_parser().parse_args(a), argv[1:])
        if args is not None and args.module:
            return our_command(["python", "-m", args.training_script, *args.training_script_args])
    return None


class _Parsed(BaseException):
    """Raised as soon as a parser has accepted its arguments: nothing past parse_args runs.
    A BaseException, so that a command's own `except Exception` cannot swallow it."""

    def __init__(self, namespace: argparse.Namespace):
        super().__init__()
        self.namespace = namespace


def parsed(entry, argv: list[str]) -> argparse.Namespace | None:
    """The namespace `entry(argv)` parses its arguments into, stopping there; None for --help and
    --version; raises AssertionError with argparse's message when the arguments are refused."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    errors = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(errors), \
            contextlib.redirect_stdout(io.StringIO()):
        patch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
        try:
            entry(argv)
        except _Parsed as done:
            return done.namespace
        except SystemExit as stop:
            if stop.code in (0, None):
                return None  # --help or --version
            message = errors.getvalue().strip().splitlines() or [f"exit status {stop.code}"]
            raise AssertionError(message[-1]) from None
    raise AssertionError(f"{entry.__module__}.{entry.__name__} returned without parsing its arguments")


def check_command(module: str, argv: list[str]) -> None:
    """Parse `python -m module argv` with the parser that command really uses."""
    if module == "train":
        from train.train import get_args_parser
        parsed(lambda a: get_args_parser().parse_args(a), argv)
    elif module == "dali_pipes.doctor":
        from dali_pipes.tools import doctor
        parsed(doctor.parse_args, argv)
    elif module in ("dali_pipes", "dali_pipes.tools.cli"):
        check_cli(argv)
    else:
        parsed(importlib.import_module(module).main, argv)  # a benchmark: its main parses first


def check_cli(argv: list[str]) -> None:
    """`dali-pipes ARGV`, dispatched as cli.main dispatches it: doctor and profile take their own flags,
    `bench NAME ARGS` hands ARGS to that benchmark's parser."""
    from dali_pipes.tools import cli
    if argv[:1] == ["doctor"]:
        return check_command("dali_pipes.doctor", argv[1:])
    if argv[:1] == ["profile"]:
        return check_command("dali_pipes_bench.profile", argv[1:])
    namespace = parsed(lambda a: cli.build_parser().parse_args(a), argv)
    if namespace is not None and namespace.command == "bench" and namespace.args:
        check_command(cli.BENCHMARKS[namespace.benchmark][0], namespace.args)


def commands_in(doc: Path) -> list[tuple[int, str, tuple[str, list[str]]]]:
    """(line of the block, the command line, (module, argv)) of every command of ours in `doc`."""
    found = []
    for lang, start, lines in fenced_blocks(doc.read_text()):
        if lang not in SHELL_LANGS:
            continue
        for line in command_lines(lang, lines):
            for argv in segments(line):
                ours = our_command(argv)
                if ours:
                    found.append((start, line.strip(), ours))
    return found


# ---------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_every_relative_link_and_anchor_resolves(doc):
    problems = [f"{_id(doc)}:{n}: {why}" for n, target in links(doc.read_text())
                if (why := broken_link(doc, target))]
    assert not problems, "broken links:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_every_command_parses_with_the_projects_own_parser(doc):
    problems = []
    for start, line, (module, argv) in commands_in(doc):
        try:
            check_command(module, argv)
        except AssertionError as e:
            problems.append(f"{_id(doc)}: block at line {start}: {line}\n    -> {e}")
    assert not problems, "commands that do not parse:\n" + "\n".join(problems)


def test_the_docs_hold_commands_of_every_kind():
    """The command check is not vacuous: the docs' blocks reach each of our parsers."""
    modules = {module for doc in DOCS for _, _, (module, _) in commands_in(doc)}
    assert {"train", "dali_pipes", "dali_pipes.doctor"} <= modules
    assert any(m.startswith("dali_pipes_bench.") for m in modules)


def test_a_flag_that_does_not_exist_is_caught():
    with pytest.raises(AssertionError, match="unrecognized arguments: --epoch-count"):
        check_command("train", ["--data", "/data/train", "--epoch-count", "3"])
    with pytest.raises(AssertionError, match="--no-such-flag"):
        check_cli(["bench", "epochs", "--no-such-flag"])
    check_command(*our_command(shlex.split("torchrun --nproc_per_node=2 -m train --epochs 3")))


@pytest.mark.parametrize("doc", DOCS, ids=_id)
def test_every_test_id_names_a_test_that_exists(doc):
    text, problems = doc.read_text(), []
    for file, name in re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", text):
        if not (ROOT / file).exists():
            problems.append(f"{file}: no such file")
        elif name and not re.search(rf"^def {name}\(", (ROOT / file).read_text(), re.M):
            problems.append(f"{file}::{name}: no such test")
    problems += [f"write test ids in full (tests/FILE.py::NAME): {m}" for m in re.findall(r"`::\w+", text)]
    assert not problems, f"{_id(doc)}:\n" + "\n".join(problems)


def test_the_layout_page_names_every_module():
    layout = (ROOT / "docs" / "layout.md").read_text()
    modules = [p for package in ("dali_pipes", "train") for p in (ROOT / package).rglob("*.py")]
    modules = [p for p in modules if len([l for l in p.read_text().splitlines() if l.strip()]) > 1]
    missing = [_id(p) for p in modules if _id(p) not in layout]
    missing += [_id(p) for p in (ROOT / "dali_pipes_bench").glob("*.py") if p.name != "__init__.py"
                and p.name not in layout]
    assert not missing, "docs/layout.md does not name: " + ", ".join(missing)


def test_every_page_is_linked_from_the_readme_and_the_index():
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    readme = {Path(t.partition("#")[0]).name for _, t in links((ROOT / "README.md").read_text())}
    index = {Path(t.partition("#")[0]).name for _, t in links((ROOT / "docs" / "index.md").read_text())}
    assert pages <= readme, f"README.md does not link {sorted(pages - readme)}"
    assert pages - {"index.md"} <= index, f"docs/index.md does not link {sorted(pages - {'index.md'} - index)}"


def test_the_readme_is_a_guide_whose_quickstart_holds_the_ci_line():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    ci = (ROOT / ".ci" / "run").read_text()
    pattern = re.search(r"grep -m1 -E '([^']+)' README.md", ci).group(1)
    ci_line = next(line for line in readme.splitlines() if re.search(pattern, line))
    quickstart = readme.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    first, second = fenced_blocks(quickstart)[:2]
    assert first[2][0].endswith("-m train --arch resnet18 --image-size 128 --epochs 2 --batch-size 32")
    assert second[2] == [ci_line], "the line .ci/run runs must be the Quickstart's second block"


# The guides teach; which test pins a guarantee is the reliability page's business (and the contributors' pages').
NOT_GUIDES = {"reliability.md", "benchmarks.md", "contributing.md", "layout.md"}
GUIDES = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in NOT_GUIDES)]


def cited_tests(text: str) -> list[str]:
    """The test files a page cites in its prose: outside fenced blocks (commands to run) and HTML comments."""
    fenced = fenced_line_numbers(text)
    prose = "\n".join(line for n, line in enumerate(text.splitlines(), 1) if n not in fenced)
    prose = re.sub(r"<!--.*?-->", "", prose, flags=re.S)
    return [m for m in re.findall(r"tests/test_\w+\.py(?:::\w+)?", prose)
            if not re.search(r"pytest[^`\n]*" + re.escape(m), prose)]  # a pytest command to run names its files


@pytest.mark.parametrize("guide", GUIDES, ids=_id)
def test_the_guides_cite_no_tests(guide):
    assert cited_tests(guide.read_text()) == [], f"{_id(guide)}: cite the guarantee's reliability.md row instead"


def test_a_cited_test_in_a_guide_is_caught():
    assert cited_tests("Checked (tests/test_x.py::test_y).\n```bash\npytest tests/test_z.py\n```\n") == [
        "tests/test_x.py::test_y"]
    assert cited_tests("run `pytest -m gpu tests/test_z.py`\n<!-- tests/test_w.py -->\n") == []
