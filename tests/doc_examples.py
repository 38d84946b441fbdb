"""The code examples of README.md and docs/, as the tests check them.

Every fenced ``python`` block carries a mark on the line above it, an HTML comment the site and PyPI do not show:

* ``<!-- example: runs -->``: ``tests/integration/test_doc_examples.py`` runs it on local-cluster, with the
  names a reader brings (``spark``, ``df``: the bundled digits) defined;
* ``<!-- example: needs … -->``: it needs what the tests do not have (a Connect session, a cluster's storage, a
  tracking server's run; the mark says which), and is only compiled.

Shell blocks need no mark: every ``mpca …`` command in them is parsed by mpca's own argument parsers, and a
``train`` or ``predict`` command's configuration files and ``key=value`` overrides are validated
(``tests/unit/test_docs.py``).  The dated pages (``docs/results/``, ``docs/notes/``, the changelog) keep their
commands as they were run, and are left out of that check.
"""
from __future__ import annotations

import pathlib
import re
import shlex
import textwrap
from dataclasses import dataclass
from typing import List, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARKDOWN = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
DATED = ("docs/results/", "docs/notes/", "docs/changelog.md")
FENCE = re.compile(r"^(\s*)```(\w*)")
MARK = re.compile(r"^\s*<!--\s*example:\s*(.+?)\s*-->\s*$")
SHELL = ("bash", "sh", "shell", "console")


@dataclass(frozen=True)
class Block:
    path: pathlib.Path
    line: int  # of the opening fence
    lang: str
    code: str
    mark: Optional[str]  # "runs", "needs …", or None when the line above the fence is no mark

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: pathlib.Path) -> List[Block]:
    """Every fenced block of a Markdown file (indented ones dedented), with the mark above it."""
    found, current, start, lang, above = [], None, 0, "", None
    previous = ""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if current is None and m:
            current, start, lang = [], number, m.group(2)
            mark = MARK.match(previous)
            above = mark.group(1) if mark else None
        elif current is not None and line.strip() == "```":
            found.append(Block(path, start, lang, textwrap.dedent("\n".join(current)), above))
            current = None
        elif current is not None:
            current.append(line)
        if line.strip():
            previous = line
    return found


def python_blocks(path: pathlib.Path) -> List[Block]:
    return [b for b in blocks(path) if b.lang == "python"]


def undated(path: pathlib.Path) -> bool:
    return not str(path.relative_to(ROOT)).startswith(DATED)


def mpca_commands(block: Block) -> List[List[str]]:
    """The argument lists of the ``mpca …`` commands of a shell block (continuation lines joined, comments and a
    leading ``VAR=value`` or ``time`` dropped)."""
    commands = []
    for line in block.code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words and (re.match(r"^[A-Z_]+=", words[0]) or words[0] == "time"):
            words = words[1:]
        if words[:1] == ["mpca"]:
            commands.append(words[1:])
    return commands
