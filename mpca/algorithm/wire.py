"""Wire formats: how a vector of model values crosses the network, and the error feedback that keeps lossy
formats unbiased over many messages.

* ``fp32`` — the values as they are, in the layout's wire dtype (bit-exact; float64 models stay float64).
* ``bf16`` — bfloat16, rounded to nearest even: 2 bytes a value, 8 significant bits.
* ``int8`` — per block of ``block`` values one float32 scale s = max|x| / 127 and q = round(x / s) in
  [−127, 127]: 1 byte a value and 4 bytes a block (INTELLECT-1's int8 all-reduce, per block).
* ``int4`` — the same with q in [−7, 7], two values a byte (Streaming DiLoCo's 4-bit exchange).

A lossy decode differs from its input by at most half a quantisation step per value (s / 2 for the integer
formats, one bf16 rounding for bf16).  A block holding NaN or Inf is refused (``ValueError``): its scale would
be meaningless, and the runtime never lets non-finite values reach the joint model.

:class:`ErrorFeedback` is the sender's side of a lossy stream (an agent's shard going up, the driver's
projection going down): it adds to each message what the previous message of the same stream lost, so the
sum of what was received tracks the sum of the true values within one quantisation step however many
messages were sent (Seide et al. 2014; Karimireddy et al. 2019's EF-SGD).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Hashable, Literal, Optional, Tuple, get_args

import numpy as np

WireFormat = Literal["fp32", "bf16", "int8", "int4"]
FORMATS: Tuple[str, ...] = get_args(WireFormat)
DEFAULT_BLOCK = 4096
_LEVELS = {"int8": 127, "int4": 7}


@dataclass(frozen=True)
class Codec:
    """One wire format.  ``dtype``: the values' own dtype, what :meth:`decode` returns (and what ``fp32`` sends)."""

    fmt: str = "fp32"
    block: int = DEFAULT_BLOCK
    dtype: str = "float32"

    def __post_init__(self):
        if self.fmt not in FORMATS:
            raise ValueError(f"wire format must be one of {', '.join(FORMATS)}, got {self.fmt!r}")
        if self.block < 1:
            raise ValueError(f"block must be >= 1, got {self.block}")

    @staticmethod
    def of(fmt: str, block: int, values_dtype) -> "Codec":
        """The codec of a run: its wire format for values of ``values_dtype`` (a torch or numpy dtype)."""
        return Codec(fmt, block, np.dtype(str(values_dtype).replace("torch.", "")).name)

    @property
    def lossy(self) -> bool:
        return self.fmt != "fp32"

    def nbytes(self, n: int) -> int:
        """Bytes of one encoded vector of ``n`` values."""
        if self.fmt == "fp32":
            return n * np.dtype(self.dtype).itemsize
        if self.fmt == "bf16":
            return 2 * n
        blocks = -(-n // self.block)
        return 4 * blocks + (n if self.fmt == "int8" else -(-n // 2))

    def encode(self, x: np.ndarray) -> bytes:
        x = np.ascontiguousarray(x).reshape(-1)
        if self.fmt == "fp32":
            return np.ascontiguousarray(x, dtype=self.dtype).tobytes()
        x = x.astype(np.float32, copy=False)
        if not np.isfinite(x).all():
            raise ValueError(f"a {self.fmt} block holds NaN/Inf: refused (the joint model stays finite)")
        if self.fmt == "bf16":
            return _to_bf16(x).tobytes()
        scales, q = _quantize(x, self.block, _LEVELS[self.fmt])
        if self.fmt == "int4":
            q = _pack4(q)
        return scales.tobytes() + q.tobytes()

    def decode(self, data, n: int) -> np.ndarray:
        buf = memoryview(data)
        if len(buf) != self.nbytes(n):
            raise ValueError(f"a {self.fmt} message of {n} values has {self.nbytes(n)} bytes, got {len(buf)}")
        if self.fmt == "fp32":  # a writable buffer (a received message) is viewed, not copied
            out = np.frombuffer(buf, dtype=self.dtype)
            return out.copy() if buf.readonly else out
        if self.fmt == "bf16":
            out = (np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            blocks = -(-n // self.block)
            scales = np.frombuffer(buf[:4 * blocks], dtype=np.float32)
            body = np.frombuffer(buf[4 * blocks:], dtype=np.int8 if self.fmt == "int8" else np.uint8)
            q = body if self.fmt == "int8" else _unpack4(body, n)
            padded = np.zeros(blocks * self.block, dtype=np.float32)
            padded[:n] = q
            out = (padded.reshape(blocks, self.block) * scales[:, None]).reshape(-1)[:n]
        return out.astype(self.dtype)


def _to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 → the upper 16 bits of its nearest bfloat16 (ties to even)."""
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _quantize(x: np.ndarray, block: int, levels: int) -> Tuple[np.ndarray, np.ndarray]:
    """Per block: scale = max|x| / levels (1 where the block is all zeros) and round(x / scale)."""
    n = x.size
    blocks = -(-n // block)
    padded = np.zeros(blocks * block, dtype=np.float32)
    padded[:n] = x
    padded = padded.reshape(blocks, block)
    amax = np.abs(padded).max(axis=1)
    scales = np.where(amax > 0, amax / levels, 1.0).astype(np.float32)
    q = np.clip(np.rint(padded / scales[:, None]), -levels, levels).astype(np.int8)
    return scales, q.reshape(-1)[:n]


def _pack4(q: np.ndarray) -> np.ndarray:
    """Values in [−7, 7] as nibbles 1..15, two a byte (the first in the low nibble)."""
    u = (q.astype(np.int16) + 8).astype(np.uint8)
    if u.size % 2:
        u = np.append(u, np.uint8(8))
    return u[0::2] | (u[1::2] << 4)


def _unpack4(body: np.ndarray, n: int) -> np.ndarray:
    out = np.empty(body.size * 2, dtype=np.int8)
    out[0::2] = (body & 0x0F).astype(np.int8) - 8
    out[1::2] = (body >> 4).astype(np.int8) - 8
    return out[:n]


class ErrorFeedback:
    """The sender of lossy streams, one residual per stream (e.g. per shard): what the last message lost is
    added to the next one.  With ``fp32`` nothing is lost and nothing is kept."""

    def __init__(self, codec: Codec):
        self.codec = codec
        self.residual: Dict[Hashable, np.ndarray] = {}

    def encode(self, stream: Hashable, x: np.ndarray) -> bytes:
        """``x`` plus the stream's residual, encoded; the residual becomes what this message loses."""
        if not self.codec.lossy:
            return self.codec.encode(x)
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        r: Optional[np.ndarray] = self.residual.get(stream)
        y = x + r if r is not None and r.shape == x.shape else x
        data = self.codec.encode(y)
        self.residual[stream] = y - self.codec.decode(data, y.size).astype(np.float32)
        return data

    def state_dict(self) -> Dict[str, object]:
        """The residuals (copies), keyed by ``str(stream)``; safe while another thread encodes."""
        return {"residual": {str(k): v.copy() for k, v in list(self.residual.items())}}

    def load_state_dict(self, state: Dict[str, object], key=int) -> None:
        self.residual = {key(k): np.asarray(v, dtype=np.float32).copy() for k, v in state["residual"].items()}


@dataclass
class EncodedSum:
    """A partial sum of Eq. 9 (Σ τᵢ xᵢ over some agents, and Σ τᵢ) carried in a lossy wire format between the
    exchange tasks and the driver.  Two partials combine by decoding both, adding and encoding the sum again —
    one rounding per level of Spark's treeReduce, on the executors; the driver decodes the root
    (:meth:`decoded`).  ``data`` is None while no agent contributed a positive weight."""

    data: Optional[bytes]
    n: int
    weight: float
    codec: Codec

    @staticmethod
    def of(x: np.ndarray, tau: float, codec: Codec) -> "EncodedSum":
        """One agent's contribution: its (decoded) shard ``x`` with weight τ."""
        if tau < 0:
            raise ValueError(f"tau must be >= 0, got {tau}")
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        return EncodedSum(codec.encode(x * np.float32(tau)) if tau > 0 else None, x.size, float(tau), codec)

    @staticmethod
    def received(data, n: int, tau: float, codec: "Codec") -> "EncodedSum":
        """One agent's contribution as it arrived (``data``: its shard encoded, ``n`` values) with weight τ.
        For the block formats τ·x is the same q with every block's scale times τ (round(τ q s / (τ s)) = q), so
        only the scales change: no decode and no encode on the exchange task."""
        if tau < 0:
            raise ValueError(f"tau must be >= 0, got {tau}")
        if tau == 0:
            return EncodedSum(None, n, 0.0, codec)  # no steps: nothing to decode
        if codec.fmt not in _LEVELS:
            return EncodedSum.of(codec.decode(data, n), tau, codec)
        buf = memoryview(data)
        if len(buf) != codec.nbytes(n):
            raise ValueError(f"a {codec.fmt} message of {n} values has {codec.nbytes(n)} bytes, got {len(buf)}")
        blocks = -(-n // codec.block)
        scales = np.frombuffer(buf[:4 * blocks], dtype=np.float32) * np.float32(tau)
        if not np.isfinite(scales).all():
            raise ValueError(f"a {codec.fmt} block holds NaN/Inf: refused (the joint model stays finite)")
        return EncodedSum(scales.tobytes() + bytes(buf[4 * blocks:]), n, float(tau), codec)

    def values(self) -> Optional[np.ndarray]:
        return None if self.data is None else self.codec.decode(self.data, self.n).astype(np.float32)

    def combine(self, other: "EncodedSum") -> "EncodedSum":
        weight = self.weight + other.weight
        if self.data is None or other.data is None:
            data = self.data if other.data is None else other.data
            return EncodedSum(data, max(self.n, other.n), weight, self.codec)
        return EncodedSum(self.codec.encode(self.values() + other.values()), self.n, weight, self.codec)

    def decoded(self):
        """The partial as the driver rule takes it (:class:`~mpca.algorithm.rules.WeightedSum`)."""
        from mpca.algorithm.weighted_sum import WeightedSum

        v = self.values()
        return WeightedSum(None if v is None else v.astype(self.codec.dtype), self.weight)
