"""What a user installs: the sdist and the wheel built from it hold every module and data file of the source
tree, and every module imports from the unpacked wheel alone (not from this checkout).

The suite itself runs on an editable install, which would hide a package the build leaves out (the wheel
once shipped without ``mpca/runtime``: ``ModuleNotFoundError`` on a user's first ``fit``).
"""
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_FILES = ("setup.cfg", "pyproject.toml", "README.md")


def source_files() -> set:
    """Every file of the package in the source tree (``mpca/...``), caches left out."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, "mpca")):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if not name.endswith((".pyc", ".pyo")):
                found.add(os.path.relpath(os.path.join(dirpath, name), ROOT).replace(os.sep, "/"))
    return found


def _build(kind: str, source: str, out: str) -> str:
    """``build_sdist`` / ``build_wheel`` of setuptools' PEP 517 backend, run in ``source`` (no network)."""
    code = f"from setuptools import build_meta as b; print(b.build_{kind}({out!r}))"
    p = subprocess.run([sys.executable, "-c", code], cwd=source, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return os.path.join(out, p.stdout.strip().splitlines()[-1])


def test_sdist_and_wheel_hold_every_module_and_import_without_the_checkout(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(os.path.join(ROOT, "mpca"), tree / "mpca", ignore=shutil.ignore_patterns("__pycache__"))
    for name in BUILD_FILES:
        shutil.copy(os.path.join(ROOT, name), tree / name)
    expected = source_files()

    sdist = _build("sdist", str(tree), str(tmp_path / "dist"))
    with tarfile.open(sdist) as t:
        top = t.getnames()[0].split("/")[0]
        in_sdist = {n.split("/", 1)[1] for n in t.getnames() if n.startswith(f"{top}/mpca/")}
        t.extractall(tmp_path / "unpacked", filter="data")
    assert expected - in_sdist == set(), "missing from the sdist"

    wheel = _build("wheel", str(tmp_path / "unpacked" / top), str(tmp_path / "dist"))  # the wheel pip makes of it
    with zipfile.ZipFile(wheel) as z:
        in_wheel = {n for n in z.namelist() if n.startswith("mpca/")}
        z.extractall(tmp_path / "site")
    assert expected - in_wheel == set(), "missing from the wheel"

    modules = sorted(n[:-3].replace("/", ".").removesuffix(".__init__") for n in expected if n.endswith(".py"))
    check = ("import importlib, mpca, sys; assert mpca.__file__.startswith(sys.argv[1]), mpca.__file__\n"
             "for m in sys.argv[2:]: importlib.import_module(m)\n")
    site = str(tmp_path / "site")
    p = subprocess.run([sys.executable, "-c", check, site, *modules], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": site}, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]


def test_the_teacher_tasks_row_generator_imports_no_torch():
    """The executors' Python workers that generate the teacher task's rows (and hash its holdout) import
    ``mpca.data`` alone: ``import mpca`` must not pull in torch (~2 s of CPU per worker on a fresh session)."""
    code = ("import sys, mpca, mpca.data.synthetic, mpca.data.datasets, mpca.data.split, mpca.data.xxhash\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
            "from mpca import register, Trainer\n"
            "print(register.__module__, Trainer.__module__)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.splitlines() == ["[]", "mpca.algorithm.registry mpca.trainer"], p.stdout


def test_the_command_lines_parser_imports_no_torch():
    """``mpca --version`` and a bad config's one-line error come before any training: building the parser
    (``mpca simulate``'s and ``mpca plan``'s options among it) must not import torch (~2.5 s of CPU)."""
    code = ("import sys\nfrom mpca.cli import build_parser\nbuild_parser()\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.splitlines() == ["[]"], p.stdout
    p = subprocess.run([sys.executable, "-m", "mpca.cli", "--version"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("mpca "), (p.stdout, p.stderr[-2000:])
