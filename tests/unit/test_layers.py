"""The package's structure, checked from its source (no import, no process): every module imports only its own
layer or the layers below it (ARCHITECTURE.md), and no module uses another module's private names."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mpca"
# lowest first; a module may import from its own layer and the ones before it
LAYERS = [
    ["mpca.errors", "mpca.spellings", "mpca.local_cluster", "mpca.compat", "mpca.storage", "mpca.report"],
    ["mpca.algorithm"],  # the pure algorithms: torch and pydantic only
    ["mpca.exchange"],  # the transport-free exchange core: the mechanics both drivers (Spark, the simulator) run
    ["mpca.data", "mpca.models"],
    ["mpca.config"],
    ["mpca.checkpoint", "mpca.stopping", "mpca.evaluation", "mpca.progress", "mpca.observers"],
    ["mpca.sim"],  # the virtual-time simulator: the algorithms' rules without Spark (never mpca.runtime)
    ["mpca.runtime"],  # Spark
    ["mpca.trainer", "mpca.connect"],  # fit, and fit over Spark Connect (its client and coordinator)
    ["mpca.ml", "mpca.tracking"],
    ["mpca.job", "mpca.predict", "mpca.bench"],
    ["mpca.cli"],
]


def _name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    for i, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    raise AssertionError(f"{module} is in no layer of tests/unit/test_layers.py: add it to LAYERS")


def _imports(path: pathlib.Path):
    """(line, imported module, imported names) of every import in the file, lazy ones included."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, ()
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module, tuple(a.name for a in node.names)


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py")  # the package's facade


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _name(p))
def test_no_module_imports_a_layer_above_its_own(path):
    own = _layer(_name(path))
    upward = [f"line {line}: {module}" for line, module, _ in _imports(path)
              if module.startswith("mpca") and module != "mpca" and _layer(module) > own]
    assert not upward, f"{_name(path)} (layer {own}) imports upward: {upward}"


def _private_uses(path: pathlib.Path):
    """``from mpca.x import _y`` and ``x._y`` where ``x`` names an imported mpca module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("mpca"):
                    aliases[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("mpca"):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    yield f"line {node.lineno}: from {node.module} import {a.name}"
                elif (PACKAGE.parent / (node.module.replace(".", "/") + f"/{a.name}.py")).exists() or \
                        (PACKAGE.parent / (node.module.replace(".", "/") + f"/{a.name}/__init__.py")).exists():
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"  # a module imported by name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            yield f"line {node.lineno}: {node.value.id}.{node.attr}"


SOURCES = sorted(p for d in ("mpca", "lab", "tests", "spark_jobs") for p in (ROOT / d).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_name_is_used_outside_its_module(path):
    uses = list(_private_uses(path))
    assert not uses, f"{path.relative_to(ROOT)} uses private names of other modules: {uses}"
