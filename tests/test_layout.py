"""The house rules that review found broken once, kept by a test: no import cycle in dali_pipes/ (type-only
and function-level imports counted), no function over 60 lines, DaliLoader within 180 lines, the loader's
defaults written once (config.py), train/ not installed as a package."""

import ast
import dataclasses
import inspect
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for path in (ROOT / package).rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(modules)
            found |= subs if len(subs) == len(node.names) else subs | ({node.module} & set(modules))
    return found


def test_no_import_cycle_in_the_library():
    modules = _modules("dali_pipes")
    edges = {m: _imports(p, modules) - {m} for m, p in modules.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(edges[m]):
            assert state.get(n) != 1, "import cycle: " + " -> ".join(path[path.index(n):] + [m, n])
            if n not in state:
                visit(n, path + [m])
        state[m] = 2

    for m in sorted(modules):
        if m not in state:
            visit(m, [])


def test_functions_and_the_loader_stay_small():
    long = []
    for package in ("dali_pipes", "dali_pipes_bench", "train", "scripts"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
                if isinstance(node, ast.ClassDef) and node.name == "DaliLoader":
                    assert node.end_lineno - node.lineno + 1 <= 180, "DaliLoader over 180 lines"
    assert long == []
    assert len((ROOT / "train" / "train.py").read_text().splitlines()) <= 320


def test_loader_defaults_are_written_once():
    from dali_pipes import DaliLoader, LoaderConfig, SourceConfig
    parameters = inspect.signature(DaliLoader).parameters
    for config in (LoaderConfig(), SourceConfig()):
        for field in dataclasses.fields(config):
            if field.name in parameters:
                assert parameters[field.name].default == getattr(config, field.name), field.name


def test_train_is_run_from_a_checkout_not_installed():
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert "train" not in packages and "dali_pipes" in packages
