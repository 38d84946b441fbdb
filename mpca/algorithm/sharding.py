"""Split a model's flat parameter vector into S shards balanced by bytes.

The paper (§4.2, §7.2.2) could only cut the model at layer boundaries; here the
*flat* vector of exchanged tensors is cut wherever the byte budget says, so a
shard may end in the middle of a weight matrix.  A shard is a list of
:class:`Segment` s, each a contiguous element range of one tensor, so reading
or writing a shard touches only views of the live tensors (no copy of the
model).

Which tensors are exchanged:

* every parameter (shared parameters once), in ``named_parameters`` order;
* floating-point buffers (e.g. BatchNorm ``running_mean``/``running_var``) unless
  ``buffers="local"`` (the setting's default is ``recalibrate``): they are τ-weighted-averaged and pulled
  like parameters, so the joint model carries statistics consistent with its
  weights; with ``buffers="local"`` they stay agent-local; ``buffers="recalibrate"``
  exchanges them as ``average`` does, and the driver re-estimates them on training
  rows before it scores or saves the joint model (as it must under ``local``).
* integer buffers (``num_batches_tracked``) are never exchanged: a counter has
  no meaningful average.  The joint model keeps its own.

On the wire and on the driver a shard is one 1-D tensor of the *wire dtype*:
the widest floating dtype among the exchanged tensors (float64 if any tensor is
float64, else float32), so a round trip is bit-exact for float16, bfloat16,
float32 and float64 alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

import torch

BUFFER_MODES = ("average", "local", "recalibrate")  # recalibrate: averaged, then re-estimated to score


@dataclass(frozen=True)
class TensorSpec:
    """Name, element count and dtype of one exchanged tensor."""

    name: str
    numel: int
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class Segment:
    """Elements ``[start, stop)`` of the flattened tensor number ``tensor``."""

    tensor: int
    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


def exchanged_tensors(module: torch.nn.Module, buffers: str = "average") -> List[Tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs of ``module`` that take part in the exchange, in a fixed order."""
    if buffers not in BUFFER_MODES:
        raise ValueError(f"buffers must be one of {BUFFER_MODES}, got {buffers!r}")
    out: List[Tuple[str, torch.Tensor]] = []
    seen = set()
    for name, p in module.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    if buffers != "local":  # average, recalibrate: exchanged and averaged with the weights
        for name, b in module.named_buffers():
            if b is not None and b.is_floating_point() and id(b) not in seen:
                seen.add(id(b))
                out.append((name, b))
    for name, t in out:
        if not t.is_floating_point():
            raise ValueError(f"exchanged tensor {name!r} has non-floating dtype {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(
                f"tensor {name!r} is not contiguous (e.g. channels_last); call .contiguous() on the model's "
                "parameters before training with mpca"
            )
    return out


FRAGMENT_MODES = ("strided", "sequential")  # whole layers; "bytes" (ShardLayout.from_module) cuts like mpca's shards


def layers_of(specs: Sequence[TensorSpec]) -> List[List[int]]:
    """The exchanged tensors grouped by the module that owns them (the name up to its last dot: ``blocks.3.attn``
    for ``blocks.3.attn.weight`` and ``.bias``), in order of first appearance: the layers that fragments hold whole."""
    order: dict = {}
    for i, spec in enumerate(specs):
        order.setdefault(spec.name.rpartition(".")[0], []).append(i)
    return list(order.values())


def fragment_groups(specs: Sequence[TensorSpec], fragments: int, mode: str) -> List[List[int]]:
    """Streaming DiLoCo's fragments (Douillard et al. 2025, §2.2): the model's layers in ``fragments`` groups.
    ``"strided"``: layer l goes to fragment l mod P (the paper's default: each fragment spans the whole depth);
    ``"sequential"``: consecutive layers, cut where the bytes before the cut reach p/P of the model's."""
    if mode not in FRAGMENT_MODES:
        raise ValueError(f"fragments must be one of {FRAGMENT_MODES}, got {mode!r}")
    layers = layers_of(specs)
    if len(layers) < fragments:
        raise ValueError(f"the model has {len(layers)} layer(s) with exchanged tensors; it cannot be cut into "
                         f"{fragments} fragments of whole layers (lower the number of fragments, or cut by bytes: "
                         "fragment_layout: bytes)")
    if mode == "strided":
        return [[i for layer in layers[p::fragments] for i in layer] for p in range(fragments)]
    sizes = [sum(specs[i].nbytes for i in layer) for layer in layers]
    total, groups, acc, p = sum(sizes), [[] for _ in range(fragments)], 0, 0
    for k, (layer, size) in enumerate(zip(layers, sizes)):
        # move on once this fragment reached its share, keeping a layer for every fragment still to fill
        left = len(layers) - k
        if groups[p] and (acc >= (p + 1) * total / fragments or left <= fragments - 1 - p):
            p += 1
        groups[p].extend(layer)
        acc += size
    return groups


def wire_dtype_for(dtypes: Iterable[torch.dtype]) -> torch.dtype:
    """float64 when any exchanged tensor is float64, else float32 (exact for all narrower floats)."""
    return torch.float64 if any(d == torch.float64 for d in dtypes) else torch.float32


class ShardLayout:
    """A byte-balanced split of a sequence of tensors into ``num_shards`` shards.

    Pure description (names, sizes, dtypes, cut points); bind it to live tensors
    with :meth:`bind`.  Cut ``k`` lies at byte ``round(k * total_bytes / S)``,
    moved to the nearest element boundary of the tensor it falls in, so shard
    sizes differ by at most one element's bytes plus rounding.
    """

    def __init__(self, specs: Sequence[TensorSpec], num_shards: int = 3,
                 groups: Optional[Sequence[Sequence[int]]] = None):
        """``groups``: instead of cuts by bytes, shard ``s`` holds the whole tensors ``groups[s]`` (in order)."""
        if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
            raise ValueError(f"num_shards must be an integer >= 1, got {num_shards!r}")
        specs = tuple(specs)
        total_numel = sum(s.numel for s in specs)
        if total_numel < num_shards:
            raise ValueError(f"cannot split {total_numel} elements into {num_shards} non-empty shards")
        self.specs = specs
        self.num_shards = num_shards
        self.wire_dtype = wire_dtype_for(s.dtype for s in specs)
        if groups is None:
            self.shards: Tuple[Tuple[Segment, ...], ...] = self._cut(specs, num_shards)
        else:
            flat = sorted(i for g in groups for i in g)
            if len(groups) != num_shards or flat != list(range(len(specs))) or any(not g for g in groups):
                raise ValueError(f"groups must split tensors 0..{len(specs) - 1} into {num_shards} non-empty groups")
            self.shards = tuple(tuple(Segment(i, 0, specs[i].numel) for i in g) for g in groups)

    @classmethod
    def from_module(cls, module: torch.nn.Module, num_shards: int = 3, buffers: str = "average",
                    fragments: Optional[str] = None) -> "ShardLayout":
        """The layout of ``module``'s exchanged tensors: cut by bytes (``fragments`` None or ``"bytes"``), or whole
        layers grouped into ``num_shards`` fragments (``"strided"`` or ``"sequential"``, :func:`fragment_groups`)."""
        tensors = exchanged_tensors(module, buffers)
        specs = [TensorSpec(n, t.numel(), t.dtype) for n, t in tensors]
        if fragments is None or fragments == "bytes":
            return cls(specs, num_shards)
        return cls(specs, num_shards, groups=fragment_groups(specs, num_shards, fragments))

    @staticmethod
    def _cut(specs: Sequence[TensorSpec], num_shards: int) -> Tuple[Tuple[Segment, ...], ...]:
        # Global element positions of the cuts, chosen by byte targets.
        total_bytes = sum(s.nbytes for s in specs)
        starts_elem, starts_byte = [], []
        e = b = 0
        for s in specs:
            starts_elem.append(e)
            starts_byte.append(b)
            e += s.numel
            b += s.nbytes
        total_numel = e
        cuts = [0]
        for k in range(1, num_shards):
            target = k * total_bytes / num_shards
            # tensor containing the target byte
            i = max(j for j in range(len(specs)) if starts_byte[j] <= target or j == 0)
            while specs[i].numel == 0 and i > 0:
                i -= 1
            offset = round((target - starts_byte[i]) / specs[i].dtype.itemsize)
            pos = starts_elem[i] + min(max(offset, 0), specs[i].numel)
            # keep every shard non-empty
            pos = max(pos, cuts[-1] + 1)
            pos = min(pos, total_numel - (num_shards - k))
            cuts.append(pos)
        cuts.append(total_numel)
        shards = []
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            segs = []
            for i, s in enumerate(specs):
                a, z = max(lo, starts_elem[i]), min(hi, starts_elem[i] + s.numel)
                if a < z:
                    segs.append(Segment(i, a - starts_elem[i], z - starts_elem[i]))
            shards.append(tuple(segs))
        return tuple(shards)

    def shard_numel(self, s: int) -> int:
        return sum(seg.numel for seg in self.shards[s])

    def shard_nbytes(self, s: int) -> int:
        return sum(seg.numel * self.specs[seg.tensor].dtype.itemsize for seg in self.shards[s])

    @property
    def total_numel(self) -> int:
        return sum(s.numel for s in self.specs)

    def split_join(self, payload: torch.Tensor) -> Tuple[List[torch.Tensor], torch.Tensor]:
        """A join's payload (:meth:`~mpca.algorithm.DriverRule.join_payload`) as one vector per shard and the
        driver rule's join state after them (empty where it has none)."""
        sizes = [self.shard_numel(s) for s in range(self.num_shards)]
        if payload.dim() != 1 or payload.numel() < sum(sizes):
            raise ValueError(f"join payload has {payload.numel()} values, the model {sum(sizes)}")
        *shards, state = torch.split(payload, sizes + [payload.numel() - sum(sizes)])
        return list(shards), state

    def bind(self, tensors: Sequence[torch.Tensor]) -> "BoundShards":
        tensors = list(tensors)
        if len(tensors) != len(self.specs):
            raise ValueError(f"layout describes {len(self.specs)} tensors, got {len(tensors)}")
        for spec, t in zip(self.specs, tensors):
            if t.numel() != spec.numel or t.dtype != spec.dtype:
                raise ValueError(
                    f"tensor {spec.name!r} is {tuple(t.shape)} {t.dtype}, layout expects {spec.numel} x {spec.dtype}"
                )
        return BoundShards(self, tensors)

    def bind_module(self, module: torch.nn.Module, buffers: str = "average") -> "BoundShards":
        return self.bind([t for _, t in exchanged_tensors(module, buffers)])

    def describe(self) -> str:
        parts = [f"shard {s}: {self.shard_numel(s):,} elems / {self.shard_nbytes(s):,} B" for s in range(self.num_shards)]
        return "; ".join(parts)


class BoundShards:
    """A :class:`ShardLayout` bound to live tensors: zero-copy views, reads and writes of shards."""

    def __init__(self, layout: ShardLayout, tensors: List[torch.Tensor]):
        self.layout = layout
        flat = [t.detach().view(-1) for t in tensors]
        self._views: List[List[torch.Tensor]] = [
            [flat[seg.tensor][seg.start:seg.stop] for seg in segs] for segs in layout.shards
        ]

    @property
    def device(self) -> torch.device:
        return self._views[0][0].device

    def views(self, s: int) -> List[torch.Tensor]:
        """Views of the live tensors making up shard ``s`` (no copy: writing them writes the model)."""
        return self._views[s]

    def read(self, s: int, device: str | torch.device = "cpu") -> torch.Tensor:
        """A copy of shard ``s`` as one 1-D tensor of the wire dtype."""
        wire = self.layout.wire_dtype
        return torch.cat([v.to(device=device, dtype=wire) for v in self._views[s]])

    def split(self, s: int, vec: torch.Tensor) -> List[torch.Tensor]:
        """Cut a 1-D wire vector of shard ``s`` into pieces shaped, typed and placed like :meth:`views`."""
        views = self._views[s]
        if vec.dim() != 1 or vec.numel() != self.layout.shard_numel(s):
            raise ValueError(f"shard {s} has {self.layout.shard_numel(s)} elements, got shape {tuple(vec.shape)}")
        pieces = torch.split(vec, [v.numel() for v in views])
        return [p.to(device=v.device, dtype=v.dtype) for p, v in zip(pieces, views)]

    @torch.no_grad()
    def write(self, s: int, vec: torch.Tensor) -> None:
        """Overwrite shard ``s`` of the live tensors with the 1-D wire vector ``vec``."""
        torch._foreach_copy_(self._views[s], self.split(s, vec))
