"""The layout rules docs/ARCHITECTURE.md states, checked on the source: the package's modules in
layers (``LAYERS``, the table ARCHITECTURE.md draws), each importing only from the layers below
its own, and inside its own layer only from its own package; no torch imported at import time
from ``config`` down; no import cycle; no function longer than 60 lines unless a comment on
its ``def`` line says why (``# long: ...``); no line wider than 120 characters; and
ARCHITECTURE.md naming every module, and no file or function that is gone.

Every import counts: relative ones (``from ..evaluate import bleu``), imports inside functions,
and imports under ``if TYPE_CHECKING:``, since a type hint that names a module above is a
dependency on it all the same."""

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from helpers import ROOT

PACKAGE = ROOT / "xformer_cli"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
MAX_LINES = 60
MAX_WIDTH = 120


@dataclass(frozen=True)
class Layer:
    name: str
    members: tuple[str, ...]  # paths under xformer_cli/: a module, or a package's folder ("serve/")


# Top first. A module imports from the layers below its own; inside its own layer only from its
# own member (its package, or itself): serve and train, say, share a layer and import neither
# the other. docs/ARCHITECTURE.md's "Layers" table lists the same, with why each sits where.
LAYERS = (
    Layer("entry", ("__main__.py",)),
    Layer("commands", ("cli/", "__init__.py")),
    Layer("pipeline", ("pipeline/",)),
    Layer("applications", ("serve/", "train/")),
    Layer("text", ("text/",)),
    Layer("engines", ("decode/", "importers/")),
    Layer("formats", ("export/", "data/")),
    Layer("checkpoint", ("checkpoint_file.py",)),
    Layer("model", ("model/", "device.py")),
    Layer("config", ("config.py",)),
    Layer("definitions", ("model/config.py", "precisions.py", "settings_file.py")),
    Layer("tools", ("tokenizer.py", "textio.py", "evaluate.py", "plots.py", "langid.py", "number_matching.py",
                    "run_lock.py")),
    Layer("base", ("languages.py", "fileio.py", "file_stamps.py", "number_words.py")),
    Layer("root", ("errors.py", "version.py", "cpu_cores.py")),
)
# This layer and those below it import no torch when imported: a config is read and checked,
# and `xformer --help` answers, without paying for torch.
TORCH_FREE_FROM = "config"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _absolute(node: ast.ImportFrom, path: Path) -> str:
    """The module a ``from`` import names, a relative one resolved against ``path``'s package."""
    if not node.level:
        return node.module or ""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]  # a package's __init__ is in it
    base = package[:len(package) - node.level + 1]
    return ".".join((*base, node.module) if node.module else base)


def _imports(path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The package's modules ``path`` imports, each with the line of its first import."""
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom):
            module = _absolute(node, path)
            for alias in node.names:
                full = f"{module}.{alias.name}"
                names.append(full if full in modules else module)
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            if name in modules:
                out.setdefault(name, node.lineno)
    return out


def _member(path: Path) -> tuple[int, str]:
    """(index in LAYERS, member) of a module's file; the longest member that holds it wins."""
    where = path.relative_to(PACKAGE).as_posix()
    found = [(len(member), i, member) for i, layer in enumerate(LAYERS) for member in layer.members
             if where == member or (member.endswith("/") and where.startswith(member))]
    if not found:
        raise AssertionError(f"xformer_cli/{where} is in no layer: add it to LAYERS in tests/test_layout.py "
                             "and to the Layers table of docs/ARCHITECTURE.md")
    _, index, member = max(found)
    return index, member


def _layer_breaches(modules: dict[str, Path]) -> list[str]:
    breaches = []
    for name, path in sorted(modules.items()):
        index, member = _member(path)
        for target, line in sorted(_imports(path, modules).items()):
            to_index, to_member = _member(modules[target])
            where = f"{path.relative_to(ROOT)}:{line} imports {target}"
            if to_index < index:
                breaches.append(f"{where}: layer {LAYERS[to_index].name!r} is above {LAYERS[index].name!r}")
            elif to_index == index and to_member != member:
                breaches.append(f"{where}: sideways in layer {LAYERS[index].name!r} ({member} -> {to_member})")
    return breaches


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _run_at_import(node: ast.AST) -> Iterator[ast.AST]:
    """The import statements under ``node`` that run when its module is imported: not those in
    functions, nor under ``if TYPE_CHECKING:``."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
        for other in node.orelse:
            yield from _run_at_import(other)
    elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        for child in ast.iter_child_nodes(node):
            yield from _run_at_import(child)


def _imports_torch(node: ast.AST) -> bool:
    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    return any(name == "torch" or name.startswith("torch.") for name in names if not getattr(node, "level", 0))


def test_every_import_goes_down_the_layers():
    assert _layer_breaches(_modules()) == [], ("move the code, or redraw LAYERS in tests/test_layout.py and the "
                                              "Layers table in docs/ARCHITECTURE.md with the reason")


def test_the_layer_check_reads_relative_imports_and_names_the_breach(tmp_path, monkeypatch):
    package = tmp_path / "xformer_cli"
    (package / "train").mkdir(parents=True)
    (package / "errors.py").write_text("from xformer_cli.train import tune\n", encoding="utf-8")
    (package / "train" / "tune.py").write_text("from ..errors import XformerError\n", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    modules = {"xformer_cli.errors": package / "errors.py", "xformer_cli.train.tune": package / "train" / "tune.py"}
    assert _imports(modules["xformer_cli.train.tune"], modules) == {"xformer_cli.errors": 1}
    assert _layer_breaches(modules) == [
        "xformer_cli/errors.py:1 imports xformer_cli.train.tune: layer 'applications' is above 'root'"]


def test_a_sideways_import_is_a_breach(tmp_path, monkeypatch):
    package = tmp_path / "xformer_cli"
    (package / "serve").mkdir(parents=True)
    (package / "train").mkdir()
    (package / "serve" / "app.py").write_text("import xformer_cli.train.trainer\n", encoding="utf-8")
    (package / "train" / "trainer.py").write_text("", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    modules = {"xformer_cli.serve.app": package / "serve" / "app.py",
               "xformer_cli.train.trainer": package / "train" / "trainer.py"}
    assert _layer_breaches(modules) == ["xformer_cli/serve/app.py:1 imports xformer_cli.train.trainer: "
                                        "sideways in layer 'applications' (serve/ -> train/)"]


def test_the_layers_below_config_import_no_torch():
    free = [layer.name for layer in LAYERS].index(TORCH_FREE_FROM)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _member(path)[0] >= free:
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in _run_at_import(tree) if _imports_torch(n)]
    assert found == []


@pytest.mark.slow  # a process of its own: this one has torch loaded already
def test_importing_the_config_loads_no_torch():
    probe = "import sys, xformer_cli.config; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_architecture_md_draws_the_same_layers():
    """Its Layers table: one row per layer, top first, the members in backticks."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `?(\w+)`? \| ((?:`[^`]+`(?:, )?)+) \|", text, flags=re.MULTILINE)
    drawn = [Layer(name, tuple(re.findall(r"`([^`]+)`", members))) for name, members in rows]
    assert drawn == list(LAYERS)


def _architecture_files(text: str) -> set[str]:
    """The files ARCHITECTURE.md names: ``dir/name.py``, ``name.py``, ``name.sh``, ``page.html``."""
    return set(re.findall(r"(?<![\w./$*-])((?:\w+/)*\w+\.(?:py|sh|html))\b", text))


def test_architecture_md_names_only_files_that_exist():
    """A path exists under xformer_cli/, scripts/ or the repository; a bare name (a package's row:
    ``marian.py`` in ``importers/``) is a file of the package or of one of its folders."""
    package_files = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*") if path.is_file()}
    missing = [name for name in sorted(_architecture_files(ARCHITECTURE.read_text(encoding="utf-8")))
               if not any((base / name).is_file() for base in (PACKAGE, ROOT / "scripts", ROOT))
               and not ("/" not in name and any(f.endswith("/" + name) for f in package_files))]
    assert missing == [], "docs/ARCHITECTURE.md names files that do not exist: " + ", ".join(missing)


def test_architecture_md_names_every_module():
    """By its path under xformer_cli/, or by its bare name where the row is its package's
    (``pipeline/``: ``settings.py``, ...); a package's ``__init__.py`` by ``*/__init__.py``."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    named = _architecture_files(text)
    unnamed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        folder = where.rpartition("/")[0]
        if where in named or (folder and path.name == "__init__.py" and "*/__init__.py" in text):
            continue
        if not (folder and path.name in named and f"{folder}/" in text):
            unnamed.append(where)
    assert unnamed == [], "modules missing from docs/ARCHITECTURE.md: " + ", ".join(unnamed)


def test_architecture_md_names_only_code_that_exists():
    """Every snake_case name (``fit_steps``, ``train.max_tokens``'s last part) and CamelCase name
    (``BudgetKeeper``) it mentions is still a word of the package or of scripts/: a function
    deleted or renamed leaves no name behind in the page."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    text = re.sub(r"(?:\w+/)*\w+\.(?:py|sh|html|md|yaml|json|jsonl|pt|spm)\b", " ", text)  # files: checked above
    names = set(re.findall(r"(?<![\w$-])([a-z]\w*_\w+|[A-Z][a-z]+[A-Z]\w*)\b", text))
    source = "\n".join(path.read_text(encoding="utf-8") for base in (PACKAGE, ROOT / "scripts")
                       for path in base.rglob("*.py"))
    words = set(re.findall(r"\w+", source))
    assert sorted(names - words) == [], "docs/ARCHITECTURE.md names what the code no longer has"


def test_no_import_cycle_between_modules():
    modules = _modules()
    graph = {name: set(_imports(path, modules)) - {name} for name, path in modules.items()}
    assert _cycles(graph) == []


def test_an_import_under_type_checking_counts(tmp_path):
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from xformer_cli.train.trainer import Trainer\n"
    path = tmp_path / "probe.py"
    path.write_text(source, encoding="utf-8")
    assert set(_imports(path, {"xformer_cli.train.trainer": path})) == {"xformer_cli.train.trainer"}


def test_torch_is_found_where_it_runs_at_import_only():
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
              "def f():\n    import torch\ntry:\n    from torch import nn\nexcept ImportError:\n    pass\n")
    found = [n.lineno for n in _run_at_import(ast.parse(source)) if _imports_torch(n)]
    assert found == [7]


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_function_over_60_lines_without_a_reason():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                header = lines[node.lineno - 1]
                if length > MAX_LINES and "# long:" not in header:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert long == []


def test_no_library_line_over_120_characters():
    """Option help that long belongs in docs/*.md; code and strings wrap (parentheses, implicit
    string concatenation)."""
    wide = [f"{path.relative_to(ROOT)}:{number} ({len(line)} characters)"
            for path in sorted(PACKAGE.rglob("*.py"))
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
            if len(line) > MAX_WIDTH]
    assert wide == [], "lines over 120 characters:\n" + "\n".join(wide)
