"""A saved model: ``model.pt`` (a plain ``state_dict``: ``torch.load`` + ``load_state_dict`` need no mpca)
and beside it ``model.json``, which records the architecture by import path with its keyword arguments, so
``load_model(path)`` (or ``mpca predict``) rebuilds the module without the training code at hand.
"""
from __future__ import annotations

import functools
import importlib
import io
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

import torch

from mpca.errors import UserError

FORMAT = 1


@dataclass(frozen=True)
class ModelSpec:
    """``target``: ``package.module:callable`` returning the ``torch.nn.Module``; ``kwargs``: JSON-able."""

    target: str
    kwargs: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if ":" not in self.target:
            raise ValueError(f"a model target is 'package.module:callable', got {self.target!r}")
        json.dumps(self.kwargs)  # JSON-able, or TypeError now rather than at save time

    def resolve(self) -> Callable[..., torch.nn.Module]:
        mod, _, name = self.target.partition(":")
        try:
            obj = importlib.import_module(mod)
            for part in name.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise UserError(f"model {self.target!r} cannot be imported: {e}") from None
        return obj

    def build(self) -> torch.nn.Module:
        return self.resolve()(**self.kwargs)

    def model_fn(self) -> Callable[[], torch.nn.Module]:
        """A picklable function building the module (the Trainer's ``model_fn``)."""
        return functools.partial(_build, self.target, dict(self.kwargs))

    def to_dict(self) -> Dict[str, Any]:
        return {"target": self.target, "kwargs": dict(self.kwargs)}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ModelSpec":
        return cls(str(d["target"]), dict(d.get("kwargs") or {}))

    @classmethod
    def of(cls, model_fn: Callable) -> Optional["ModelSpec"]:
        """The spec of an importable ``model_fn`` (a module-level class or function, or a
        ``functools.partial`` of one with JSON-able keyword arguments); None for a lambda or a closure."""
        kwargs: Dict[str, Any] = {}
        fn = model_fn
        if isinstance(fn, functools.partial):
            if fn.func is _build:
                return cls(fn.args[0], fn.args[1])
            if fn.args:
                return None
            kwargs, fn = dict(fn.keywords), fn.func
        mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
        if not mod or "<" in qual or mod == "__main__":
            return None
        try:
            spec = cls(f"{mod}:{qual}", kwargs)
            return spec if spec.resolve() is fn else None
        except (TypeError, ValueError, UserError):
            return None


def _build(target: str, kwargs: Dict[str, Any]) -> torch.nn.Module:
    return ModelSpec(target, kwargs).build()


def registry_spec(name: str, args: Dict[str, Any]) -> ModelSpec:
    """The spec of a job config's ``model.name``/``model.args``."""
    return ModelSpec("mpca.models:build_model", {"name": name, "args": dict(args)})


def save_model(path: str, model: torch.nn.Module, spec: Optional[ModelSpec] = None) -> str:
    """``path`` (``model.pt``) and, when the architecture is known, ``model.json`` beside it; a local path or
    a filesystem URI (through pyarrow), each file written atomically."""
    from mpca.storage import open_store

    store = open_store(os.path.dirname(path) or ".")
    store.makedirs()
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buf)
    store.write_atomic(os.path.basename(path), buf.getvalue())
    if spec is not None:
        meta = {"format": FORMAT, "architecture": spec.to_dict(), "torch": torch.__version__,
                "parameters": sum(p.numel() for p in model.parameters())}
        store.write_atomic(_meta_name(path), json.dumps(meta, indent=1).encode())
    return path


def _meta_name(path: str) -> str:
    base = os.path.basename(path)
    return (base[:-3] if base.endswith(".pt") else base) + ".json"


def read_spec(path: str) -> Optional[ModelSpec]:
    """The architecture recorded beside a saved model (None when there is no ``model.json``)."""
    from mpca.storage import open_store

    store = open_store(os.path.dirname(path) or ".")
    try:
        meta = json.loads(store.read(_meta_name(path)))
    except (OSError, FileNotFoundError):
        return None
    except ValueError as e:
        raise UserError(f"{_meta_name(path)} beside {path!r} is not valid JSON: {e}") from None
    return ModelSpec.from_dict(meta["architecture"])


def load_model(path: str, spec: Optional[ModelSpec] = None) -> torch.nn.Module:
    """Rebuild a saved model: its architecture from ``model.json`` (or ``spec``), its weights from ``path``."""
    from mpca.checkpoint import load_model_state

    spec = spec or read_spec(path)
    if spec is None:
        raise UserError(f"{path!r} has no {_meta_name(path)} recording its architecture; pass spec=ModelSpec(...) "
                        "(or model.name in the job config)")
    model = spec.build()
    state = load_model_state(path)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"{path!r} does not fit model {spec.target}: {str(e).splitlines()[0]}") from None
    return model.eval()
