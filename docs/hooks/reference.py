"""References generated from the code, for the documentation site (an MkDocs hook: ``hooks:`` in mkdocs.yml).

Never written twice: a page of ``docs/`` holds a marker line and the hook replaces it, at build time, with

* ``<!-- mpca:config-reference -->`` — every key of the settings model (:class:`mpca.config.JobConfig`, the YAML
  job; :class:`mpca.config.Settings`, the Trainer's): type, default, allowed values and constraints, description;
* ``<!-- mpca:cli-reference -->`` — the ``--help`` of ``mpca`` and of each subcommand, from the argparse parsers
  (:func:`mpca.cli.build_parser`);
* ``<!-- mpca:algorithms -->`` — the registered algorithms (:mod:`mpca.algorithm.registry`) with their settings.

The module lives outside ``mpca/`` (it is the site's, not the package's) and imports nothing of MkDocs, so a unit
test can import it (``tests/unit/test_docs.py``) and check, e.g., that every settings key has a description.
"""
from __future__ import annotations

import argparse
import enum
import os
import typing
from typing import Any, Dict, Iterator, List, Optional, Tuple

MARKERS = {
    "<!-- mpca:config-reference -->": "config_reference",
    "<!-- mpca:cli-reference -->": "cli_reference",
    "<!-- mpca:algorithms -->": "algorithms_reference",
}


# ---------------------------------------------------------------------------------------------------------------
# the settings model

def _model_of(annotation: Any):
    """The pydantic model class inside ``annotation`` (``X``, ``Optional[X]``, ``SerializeAsAny[X]``), or None."""
    from pydantic import BaseModel

    stack = [annotation]
    while stack:
        t = stack.pop()
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
        stack.extend(typing.get_args(t))
        origin = getattr(t, "__origin__", None)
        if origin is not None and origin is not typing.Union:
            stack.append(origin)
        metadata = getattr(t, "__metadata__", None)
        if metadata:
            stack.append(getattr(t, "__origin__", None))
    return None


def _type_name(annotation: Any) -> str:
    """A short, readable type: ``int``, ``float or null``, ``list[int]``, ``one of: a, b``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of: " + ", ".join(f"`{a}`" for a in args)
    if origin is typing.Union:
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin in (list, List):
        return f"list[{', '.join(_type_name(a) for a in args)}]" if args else "list"
    if origin in (dict, Dict):
        return f"map[{', '.join(_type_name(a) for a in args)}]" if args else "map"
    if args and getattr(annotation, "__metadata__", None):  # Annotated[...] / SerializeAsAny[...]
        return _type_name(args[0])
    if annotation is typing.Any:
        return "any"
    if isinstance(annotation, type):
        if issubclass(annotation, enum.Enum):
            return "one of: " + ", ".join(f"`{m.value}`" for m in annotation)
        return annotation.__name__
    return str(annotation).replace("typing.", "")


_CONSTRAINT_SIGNS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "at least {} items",
                     "max_length": "at most {} items", "pattern": "matches `{}`", "multiple_of": "a multiple of {}"}


def _constraints(field) -> str:
    """``≥ 1``, ``0.0 ≤ x < 1.0``-style text from a field's metadata (annotated_types / pydantic)."""
    found = []
    for item in field.metadata:
        for attr, sign in _CONSTRAINT_SIGNS.items():
            value = getattr(item, attr, None)
            if value is None:
                continue
            found.append(sign.format(value) if "{}" in sign else f"{sign} {value}")
    return ", ".join(found)


def _default(field) -> Any:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:  # a factory that takes the validated data
            return "(computed)"
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        name = getattr(value, "name", None)
        return name if isinstance(name, str) and "name" in type(value).model_fields else "(section)"
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _show(value: Any) -> str:
    if isinstance(value, str) and value.startswith("(") and value.endswith(")"):
        return value
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value!r}`" if isinstance(value, str) and value == "" else f"`{value}`"


def settings_keys(model=None, prefix: str = "") -> Iterator[Tuple[str, Any, bool]]:
    """Every key of ``model`` (default :class:`mpca.config.JobConfig`), dotted, with its pydantic field and
    whether it is a section (a nested model).  ``algorithm`` is a section whose keys depend on the algorithm
    chosen: its own keys are listed by :func:`algorithms_reference`, not here."""
    if model is None:
        from mpca.config import JobConfig as model
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        nested = _model_of(field.annotation)
        yield key, field, nested is not None
        if nested is not None and not (prefix == "" and name == "algorithm"):
            yield from settings_keys(nested, key + ".")


def settings_models() -> List[Any]:
    """The settings models a user writes: the Trainer's :class:`~mpca.config.Settings` and the job's
    :class:`~mpca.config.JobConfig` (its superset)."""
    from mpca.config import JobConfig, Settings

    return [Settings, JobConfig]


def missing_descriptions() -> List[str]:
    """Every settings key (of every section, of both models) without a description: should be empty."""
    missing = []
    for model in settings_models():
        for key, field, _ in settings_keys(model):
            if not (field.description or "").strip():
                missing.append(f"{model.__name__}: {key}")
    return missing


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def config_reference() -> str:
    """The configuration reference: one table per section of the job's settings (YAML, ``key=value``
    overrides), marking the keys the Python Trainer's :class:`~mpca.config.Settings` does not have."""
    from mpca.config import JobConfig, Settings

    trainer = {key: field for key, field, _ in settings_keys(Settings)}
    rows: Dict[str, List[str]] = {}
    top: List[str] = []
    sections: Dict[str, str] = {}
    for key, field, is_section in settings_keys(JobConfig):
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        if is_section:
            sections[key] = field.description or ""
            if parent == "":
                top.append(key)
            continue
        notes = []
        if key not in trainer:
            notes.append("job only (YAML, `mpca train`)")
        elif _default(trainer[key]) != _default(field):
            notes.append(f"Trainer default: {_show(_default(trainer[key]))}")
        description = _cell(field.description or "")
        if notes:
            description += f" *({'; '.join(notes)})*"
        line = (f"| `{key}` | {_cell(_type_name(field.annotation))} | {_cell(_show(_default(field)))} | "
                f"{_cell(_constraints(field)) or '—'} | {description} |")
        rows.setdefault(parent, []).append(line)

    out = ["Generated from `mpca.config` when this site was built (`docs/hooks/reference.py`): every key of a job's "
           "YAML file (`mpca.config.JobConfig`) and of the Trainer's settings (`mpca.config.Settings`, which has "
           "every key not marked *job only*). In a YAML file a key is nested (`training:` then `agents: 4`); on "
           "the command line it is dotted (`training.agents=4`); in Python the sections are keyword arguments of "
           "`Settings(...)` and the common keys have shortcuts (`mpca.config.SHORTCUTS`).", ""]
    header = ["| key | type | default | constraints | description |", "|---|---|---|---|---|"]
    if rows.get(""):
        out += ["## Top-level keys", ""] + header + rows[""] + [""]
    for section in sections:
        if section == "algorithm":
            out += ["## `algorithm`", "", _cell(sections[section]) + ". `algorithm.name` picks the algorithm; "
                    "the other keys of this section are the chosen algorithm's own: see the "
                    "[algorithms reference](algorithms.md).", ""]
            continue
        if section not in rows:
            continue
        depth = section.count(".") + 2
        out += ["#" * min(depth, 4) + f" `{section}`", "", _cell(sections[section]), ""] + header + rows[section] + [""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------------
# the command line

def _subparsers(parser: argparse.ArgumentParser) -> Dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_help() -> Dict[str, str]:
    """``mpca --help`` and ``mpca <command> --help`` of every subcommand, as argparse prints them (80 columns)."""
    from mpca.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        parser = build_parser()
        helps = {"mpca": parser.format_help()}
        for name, sub in _subparsers(parser).items():
            helps[f"mpca {name}"] = sub.format_help()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return helps


def cli_reference() -> str:
    out = ["Generated from the argument parsers (`mpca.cli.build_parser`) when this site was built. Every "
           "subcommand also takes `-v` (INFO logs) and `-q` (errors and the final result only), before or after "
           "the subcommand.", ""]
    for command, text in cli_help().items():
        out += [f"## `{command}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------------
# the algorithms

def algorithms() -> List[Tuple[str, Any]]:
    """``(name, class)`` of every registered algorithm, by name."""
    from mpca.algorithm import registry

    return [(name, registry.get(name)) for name in registry.names()]


def _first_line(doc: Optional[str]) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def algorithms_reference() -> str:
    out = ["Generated from the algorithm registry (`mpca.algorithm.registry`) when this site was built: every "
           "value `algorithm.name` accepts, how it exchanges (`cycle`: the driver's Spark jobs; `service`: the "
           "agents call the driver's parameter service), the wire format it sends where `wire.format` is unset, "
           "and its settings (`algorithm.<key>`; in `conf/digits.yaml` also `algorithm.<name>.<key>`).", "",
           "| `algorithm.name` | exchange | default wire | what it is |", "|---|---|---|---|"]
    for name, cls in algorithms():
        what = getattr(cls, "summary", "") or _first_line(cls.__doc__)
        out.append(f"| `{name}` | {cls.exchange} | {getattr(cls, 'default_wire', 'fp32')} | {_cell(what)} |")
    out.append("")
    header = ["| key | type | default | constraints | description |", "|---|---|---|---|---|"]
    for name, cls in algorithms():
        out += [f"## `{name}`", "", _cell(_first_line(cls.__doc__)) or "—", ""] + header
        for key, field in cls.model_fields.items():
            if key == "name":
                continue
            out.append(f"| `algorithm.{key}` | {_cell(_type_name(field.annotation))} | "
                       f"{_cell(_show(_default(field)))} | {_cell(_constraints(field)) or '—'} | "
                       f"{_cell(field.description or '—')} |")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------------
# the MkDocs hook

def render(markdown: str) -> str:
    """``markdown`` with every marker line replaced by its generated reference."""
    for marker, function in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, globals()[function]())
    return markdown


def on_page_markdown(markdown: str, page=None, config=None, files=None, **kwargs) -> str:
    return render(markdown)
