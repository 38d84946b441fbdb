"""ARCHITECTURE.md names every module of the package: a module added without its line there goes red here.

A module of a sub-package (``runtime/roster.py``) is named by its path anywhere in the file or by its file name in
backticks in the sub-package's own paragraph (the one that opens with **`runtime/`**); a top-level module by its
name in backticks (``trainer`` or ``trainer.py``); a sub-package's ``__init__.py`` by that paragraph."""
from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mpca"
ARCHITECTURE = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")


def _paragraph(package: str) -> str:
    """The text of the paragraph that opens with **`package/`** (empty when there is none)."""
    for block in re.split(r"\n\s*\n", ARCHITECTURE):
        if block.lstrip().startswith(f"**`{package}/`**"):
            return block
    return ""


def _named(rel: str) -> bool:
    parts = rel.split("/")
    if len(parts) == 1:  # a top-level module
        name = parts[0][:-3]
        return name == "__init__" or bool(re.search(rf"`{re.escape(name)}(\.py)?`", ARCHITECTURE))
    package, file = "/".join(parts[:-1]), parts[-1]
    own = _paragraph(package)
    if file == "__init__.py":
        return bool(own)
    return rel in ARCHITECTURE or f"`{file}`" in own or f"`{file[:-3]}`" in own


MODULES = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("rel", MODULES)
def test_architecture_names_every_module(rel):
    assert _named(rel), f"ARCHITECTURE.md does not name mpca/{rel}: add it to its group's paragraph"


def test_the_check_sees_a_module_that_is_not_named():
    assert not _named("runtime/no_such_module.py") and not _named("no_such_module.py")
    assert not _named("no_such_package/__init__.py")
