"""Algorithms by name: ``algorithm.name: sync`` in YAML, ``Trainer(..., algorithm="sync")`` in Python."""
from __future__ import annotations

from typing import Any, Dict, Type

from mpca.algorithm.base import Algorithm

_REGISTRY: Dict[str, Type[Algorithm]] = {}
BUILT_IN_MODULES = ("mpca", "single", "sync", "easgd", "diloco", "streaming_diloco", "delayed_diloco", "ddp", "hermans",
                    "rudra", "weaksync")
_built_in_loaded = False


def _load_built_in() -> None:
    """Import the built-in algorithms' modules (each registers itself) the first time the registry is asked."""
    global _built_in_loaded
    if not _built_in_loaded:
        import importlib

        for module in BUILT_IN_MODULES:
            importlib.import_module(f"mpca.algorithm.{module}")
        _built_in_loaded = True


def register(cls: Type[Algorithm]) -> Type[Algorithm]:
    """Make ``cls`` selectable by its ``name`` (use as a class decorator)."""
    name = cls.model_fields["name"].default
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__name__} needs a default name, e.g. name: Literal['toy'] = 'toy'")
    if cls.exchange not in ("cycle", "service"):
        raise ValueError(f"{cls.__name__}.exchange must be 'cycle' or 'service', got {cls.exchange!r}")
    _REGISTRY[name] = cls
    return cls


def names() -> list:
    _load_built_in()
    return sorted(_REGISTRY)


def get(name: str) -> Type[Algorithm]:
    _load_built_in()
    if name not in _REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(names())}")
    return _REGISTRY[name]


def build(value: Any) -> Algorithm:
    """An :class:`Algorithm` from a name, a mapping or an instance.

    A mapping has ``name`` (default ``mpca``) and the chosen algorithm's settings, flat or in a
    subsection named after it (flat keys win); subsections of the other algorithms are ignored, so one configuration
    can hold every algorithm's settings and ``algorithm.name`` picks one::

        {"name": "sync", "buffers": "average", "mpca": {"shards": 3}, "sync": {"every": 20}}

    Raises pydantic's ValidationError (wrong setting) or ValueError (unknown name)."""
    if isinstance(value, Algorithm):
        return value
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict):
        raise ValueError(f"an algorithm is a name or a mapping with 'name', got {type(value).__name__}")
    name = value.get("name", "mpca")
    cls = get(name)
    own = value.get(name) or {}
    if not isinstance(own, dict):
        raise ValueError(f"algorithm.{name} must be a mapping of {name}'s settings")
    flat = {k: v for k, v in value.items() if k not in _REGISTRY}
    return cls.model_validate({**_merged(own, flat), "name": name})


def _merged(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    """``base`` with ``over`` merged in, nested mappings key by key (flat keys such as command-line
    overrides win over the algorithm's own subsection)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
