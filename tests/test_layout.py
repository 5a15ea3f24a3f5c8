"""The house rules that review found broken once, kept by a test: no import cycle in dali_pipes/ or train/
(type-only and function-level imports counted), the library's floors used only downwards, no function over
50 lines, no library module over 500, DaliLoader within 160 lines and RankPipeline within 120, no settings dict
on the rank's run, the loader's defaults written once (config.py), train/ not installed as a package."""

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
import tomllib

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


def _edges(package: str) -> dict[str, set[str]]:
    modules = _modules(package)
    return {m: _imports(p, modules) - {m} for m, p in modules.items()}


@pytest.mark.parametrize("package", ["dali_pipes", "train"])
def test_no_import_cycle(package):
    edges = _edges(package)
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(edges[m]):
            assert state.get(n) != 1, "import cycle: " + " -> ".join(path[path.index(n):] + [m, n])
            if n not in state:
                visit(n, path + [m])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [])


# The library's floors, bottom up: each imports only its own floor and those below (docs/layout.md). Leaves
# that import nothing of ours sit under all of them.
LEAVES = {"dali_pipes.errors", "dali_pipes.options", "dali_pipes._version", "dali_pipes.running_framework"}
FLOORS = ["storage", "data", "graph", "run", "faces", "adapters", "tools"]
FACES = {"dali_pipes", "dali_pipes.loader", "dali_pipes.dataloader_args", "dali_pipes.loader_surface",
         "dali_pipes.detection_loader",
         "dali_pipes.torchvision_datasets", "dali_pipes.hf_datasets", "dali_pipes.baseline", "dali_pipes.config"}
# The adapters' public paths (dali_pipes.lightning, ...) sit on the adapters' floor, above the loader
ADAPTER_PATHS = {"dali_pipes.lightning", "dali_pipes.lightning_trainer", "dali_pipes.frameworks", "dali_pipes.nodes"}


def _floor(module: str) -> int:
    if module in LEAVES:
        return -1
    if module in FACES:
        return FLOORS.index("faces")
    if module in ADAPTER_PATHS:
        return FLOORS.index("adapters")
    if module in ("dali_pipes.__main__", "dali_pipes.doctor"):  # python -m dali_pipes[.doctor]: commands
        return FLOORS.index("tools")
    return FLOORS.index(module.split(".")[1])  # dali_pipes.<floor>.<module>


def test_the_floors_are_used_only_downwards():
    upward = [f"{m} -> {n}" for m, used in _edges("dali_pipes").items() for n in used if _floor(n) > _floor(m)]
    assert upward == []
    leaves_import = {m: used for m, used in _edges("dali_pipes").items() if m in LEAVES and used}
    assert leaves_import == {}


CLASS_LINES = {"DaliLoader": 160, "RankPipeline": 120}  # the DataLoader surface; the rank's run (rank.py)


def test_functions_and_the_loader_stay_small():
    long = []
    for package in ("dali_pipes", "dali_pipes_bench", "train", "scripts"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 50:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
                if isinstance(node, ast.ClassDef) and node.name in CLASS_LINES:
                    assert node.end_lineno - node.lineno + 1 <= CLASS_LINES[node.name], f"{node.name} too long"
    assert long == []
    assert len((ROOT / "train" / "train.py").read_text().splitlines()) <= 320


MODULE_LINES = 500  # a module over this has seams: carry each to its own file (docs/layout.md)


def test_no_library_module_is_over_500_lines():
    """Every module of the library (dali_pipes/; the benchmarks and the tests are not) within MODULE_LINES lines."""
    lines = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
             for path in (ROOT / "dali_pipes").rglob("*.py")}
    over = {path: n for path, n in sorted(lines.items()) if n > MODULE_LINES}
    assert over == {}, f"modules over {MODULE_LINES} lines (split each at its seams): {over}"


def test_the_rank_run_takes_typed_settings_not_dicts():
    """Settings travel as PipelineSpec (run/pipeline.py), never as a dict read through string keys: no
    function of run/ takes a parameter annotated `dict` for them, nor **kwargs of pipeline settings."""
    offenders = []
    for path in (ROOT / "dali_pipes" / "run").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in node.args.args + node.args.kwonlyargs:
                    if arg.arg in ("args", "settings", "pipeline_args") and "dict" in ast.unparse(arg.annotation or
                                                                                                   ast.Constant("")):
                        offenders.append(f"{path.name}:{node.lineno} {node.name}({arg.arg})")
    assert offenders == []
    from dali_pipes.run.pipeline import build_pipeline
    parameters = inspect.signature(build_pipeline).parameters
    assert list(parameters)[:3] == ["source", "spec", "checkpoint"]
    assert not any(p.kind == p.VAR_KEYWORD for p in parameters.values())


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


def _library_files_run_by(step) -> set[str]:
    """The dali_pipes files whose code runs while `step()` does (sys.settrace sees every Python frame)."""
    import sys

    import dali_pipes
    root = Path(dali_pipes.__file__).parent
    seen: set[str] = set()

    def tracer(frame, event, arg):
        name = frame.f_code.co_filename
        if name.startswith(str(root)):
            seen.add(str(Path(name).relative_to(root)))
        return None  # calls only: a file is counted when any of its functions runs

    sys.settrace(tracer)
    try:
        step()
    finally:
        sys.settrace(None)
    return seen


def test_one_steady_state_batch_runs_code_in_at_most_eight_library_files(numbered):
    """After DALI a batch goes through a chain of small stages (run/stages.py); one batch of a steady state (a
    CPU train loader's second epoch, its knobs tuned or fixed) runs code in at most 9 of the library's files,
    so that a reader can follow one batch."""
    from dali_pipes import DaliLoader
    loader = DaliLoader(numbered, batch_size=2, image_size=16, device="cpu", train=True)
    for _ in loader:  # the first epoch: the first batch's set-up, tuning's search
        pass
    batches = iter(loader)
    next(batches), next(batches)
    files = _library_files_run_by(lambda: next(batches))
    loader.close()
    assert len(files) <= 8, sorted(files)


# Which modules may name the val cache's and the drawn sampler's classes: their own, the loader that assembles
# them, and the static graph check, which builds a drawn order's feed to check its graph.
OWN_NAMES = {"ValCache": {"dali_pipes.run.val_cache", "dali_pipes.loader"},
             "CachedSource": {"dali_pipes.run.val_cache"},
             "SampledEpochs": {"dali_pipes.run.sampled", "dali_pipes.loader"},
             "SamplerRead": {"dali_pipes.run.sampled", "dali_pipes.loader"},
             "OrderFeed": {"dali_pipes.run.sampled", "dali_pipes.tools.graph_check"}}


def test_the_val_cache_and_the_drawn_sampler_are_reached_by_no_other_module():
    """The val cache sees the rank's pipeline through a small protocol (val_cache.CachedSource) and the rank
    is handed the drawn sampler as its hooks.EpochOrder: no other module names their classes (imports and
    type-only imports counted) or reaches for the rank's `sampled` hook, and the val cache and the stages import
    nothing of the rank's module."""
    offenders = []
    for module, path in _modules("dali_pipes").items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else \
                node.name if isinstance(node, ast.alias) else None
            if name in OWN_NAMES and module not in OWN_NAMES[name]:
                offenders.append(f"{module}: {name}")
            if isinstance(node, ast.Attribute) and node.attr == "sampled":
                offenders.append(f"{module}: .sampled")
    for module in ("dali_pipes.run.val_cache", "dali_pipes.run.stages"):
        if "dali_pipes.run.rank" in _edges("dali_pipes").get(module, set()):
            offenders.append(f"{module} imports dali_pipes.run.rank")
    assert offenders == []
