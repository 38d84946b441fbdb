"""Fair baselines: every algorithm's period (and DiLoCo's outer learning rate, MPCA's α) from a small grid per
regime, each at its best setting in the table.

The grid is built around the 1:5 rule the paper takes for the synchronous baseline from SparkNet (§3.1.2,
Table 1: the period is chosen so that communication takes a fifth of the computation between two
exchanges): with an exchange as costly as ``r`` training steps (the regime's communication/computation
ratio), H = 5 r local steps, and its neighbours H / 2 and 2 H.  The same three periods are offered to every
periodic method (sync's H, EASGD's τ, the H of DiLoCo, Streaming DiLoCo and delayed DiLoCo); EASGD also gets the
paper's lower bound for τ, K r (§3.2: every agent's round trip through the parameter server in turn), the three
DiLoCos their outer learning rate at 0.5 and 1.0 beside their default (the paper's 0.7; delayed DiLoCo's 0.35), Streaming DiLoCo also α = 1 with τ = 0
and fragments cut by bytes (:data:`STREAMING_VARIANTS`), and MPCA its long-run elastic coefficient α at half and
twice the default: 3 settings for mpca, 4 for EASGD, 5 for DiLoCo and delayed DiLoCo, 7 for Streaming
DiLoCo.  With emulated devices (a known step time T) MPCA also gets its cycle pace at the best α found
(:func:`pace_next`: at least 2 T and 5 T between the driver's cycles, beside the unpaced default; 5 settings), the
axis measured on 2026-12-03 (one cycle per 1.5 s = 5 T reached 24% in 0.76 × the unpaced time at K = 2, regime
≈ 12).  Algorithms without a period (DDP, one agent)
run once as they are.  A setting is better when it reaches more targets, then sooner the tightest one it
reached, then with the lower final error: no baseline is ever tuned down.  When the best setting lies on
the grid's edge along its main axis (the period; MPCA's α), :func:`beyond` offers the next point past it
(half the smallest period or twice the largest; half or twice α), up to :data:`EXTEND` times, so that no
algorithm's optimum is cut off by the grid; MPCA's slowest pace, when it is the best, is doubled the same way.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

PERIODIC = {"sync": "every", "easgd": "every", "diloco": "every", "streaming_diloco": "every",
            "delayed_diloco": "every"}  # the period's field in each algorithm
OUTER = ("diloco", "streaming_diloco", "delayed_diloco")  # outer Nesterov step: its learning rate is tuned too
EXTEND = 2  # points past the grid's edge at most, per algorithm


def periods(ratio: float) -> List[int]:
    """H = 5 r (the 1:5 rule) and its neighbours H / 2 and 2 H, in local steps, at least 1."""
    h = max(1, round(5 * ratio))
    return sorted({max(1, round(h / 2)), h, 2 * h})


DILOCO_OUTER_LRS = (0.5, 1.0)  # the outer learning rates tried besides the default (every OUTER algorithm)
# Streaming DiLoCo's own axes, tried at the middle period besides its defaults (P = 3 strided fragments, τ = 1,
# α = 0.5): the outer result taken whole with no overlap (α = 1, τ = 0: DiLoCo's merge, fragments kept), and
# fragments cut by bytes (the teacher MLP's three layers hold 6%, 93% and 1% of its bytes)
STREAMING_VARIANTS = (("mix=1,overlap=0", {"mix": 1.0, "overlap": 0}),
                      ("fragment_layout=bytes", {"fragment_layout": "bytes"}))
PACE_STEPS = (2, 5)  # MPCA's cycle paces tried at its best α, in steps T between two cycles (besides unpaced)
PACE = "min_cycle_interval_s"  # the pace's field in an algorithm's config


def grid(name: str, ratio: float, agents: int) -> List[Tuple[str, dict]]:
    """The settings of algorithm ``name`` to try in a regime of communication/computation ratio ``ratio``
    with ``agents`` agents: (setting's label, the algorithm's config). One entry (its defaults) for an
    algorithm without a grid."""
    if name in PERIODIC:
        hs = periods(ratio)
        if name == "easgd":
            hs = sorted(set(hs) | {max(1, round(agents * ratio))})
        points = [(f"{PERIODIC[name]}={h}", {"name": name, PERIODIC[name]: h}) for h in hs]
        h = hs[len(hs) // 2]  # 5 r
        if name in OUTER:
            points += [(f"every={h},outer_lr={lr:g}", {"name": name, "every": h, "outer_lr": lr}) for lr in DILOCO_OUTER_LRS]
        if name == "streaming_diloco":
            points += [(f"every={h},{label}", {"name": name, "every": h, **extra}) for label, extra in STREAMING_VARIANTS]
        return points
    if name == "mpca":
        from mpca.algorithm.schedules import AlphaSchedule

        default = AlphaSchedule()
        return [(f"alpha.target={a:g}", {"name": "mpca", "alpha": {"target": a}})
                for a in (default.target / 2, default.target, 2 * default.target)]
    return [("defaults", {"name": name})]


def rank_key(time_to: Dict[float, float], final_error: float, holds: bool = True) -> tuple:
    """Sort key of one setting's result (smaller is better): a run whose emulation held first, then targets
    reached (more first), time to the tightest reached, final error."""
    reached = [t for t, v in time_to.items() if not math.isnan(v)]
    if not reached:
        return (not holds, 0, math.inf, final_error)
    return (not holds, -len(reached), time_to[min(reached)], final_error)


def best(results: Sequence[Tuple[Dict[float, float], float, bool]]) -> int:
    """Index of the best of ``(time_to, final_error, emulation held)`` results (the first on a tie)."""
    keys = [rank_key(*r) for r in results]
    return min(range(len(keys)), key=lambda i: keys[i])


def _axis(name: str, algo: dict):
    """The value of ``algo`` on its algorithm's main axis, or None for a point off it (DiLoCo's outer-lr
    variants)."""
    if name in PERIODIC:
        off_axis = "outer_lr" in algo or any(k in algo for _, extra in STREAMING_VARIANTS for k in extra)
        return None if off_axis else algo[PERIODIC[name]]
    if name == "mpca":
        return None if PACE in algo else algo["alpha"]["target"]
    return None


def at_best(name: str, tried: Sequence[dict], best_index: int) -> List[Tuple[str, dict]]:
    """The settings the grid tries at its middle period only, again at the best period found when that is
    another (DiLoCo's outer learning rates: the extension past the grid's edge moves the period, and a period
    of a different length wants its own outer step), those not tried yet: (label, algorithm config)."""
    top = tried[best_index]["algorithm"]
    if name not in OUTER or "outer_lr" in top:
        return []
    done = {(p["algorithm"].get("every"), p["algorithm"].get("outer_lr")) for p in tried}
    return [(f"every={top['every']},outer_lr={lr:g}", {**top, "outer_lr": lr})
            for lr in DILOCO_OUTER_LRS if (top["every"], lr) not in done]


def beyond(name: str, tried: Sequence[dict], best_index: int):
    """The next setting past the grid's edge when the best of ``tried`` (dicts with ``algorithm``) lies on
    it along the main axis, else None: (label, algorithm config)."""
    values = [v for v in (_axis(name, p["algorithm"]) for p in tried) if v is not None]
    value = _axis(name, tried[best_index]["algorithm"])
    if value is None or len(values) < 2 or min(values) < value < max(values):
        return None
    if name in PERIODIC:
        h = max(1, round(value / 2)) if value == min(values) else 2 * value
        if h in values:
            return None  # already at one step
        field = PERIODIC[name]
        return f"{field}={h}", {**tried[best_index]["algorithm"], field: h}
    a = value / 2 if value == min(values) else min(1.0, 2 * value)
    if a in values:
        return None
    return f"alpha.target={a:g}", {"name": "mpca", "alpha": {"target": a}}


def pace_next(name: str, tried: Sequence[dict], best_index: int,
              step_s: Optional[float]) -> Optional[Tuple[str, dict]]:
    """MPCA's next cycle pace to try, or None: at the α of the best setting so far, at least ``n`` T between two
    driver cycles for each ``n`` of :data:`PACE_STEPS` not tried yet (T = ``step_s``, the emulated step; the
    unpaced default counts as a pace of 0), then, while the slowest pace tried is the best, twice it, up to
    :data:`EXTEND` times.  None for another algorithm or without a known step time (real devices: the cycle's
    natural unit is unknown before the run)."""
    if name != "mpca" or not step_s:
        return None
    top = tried[best_index]["algorithm"]
    at_alpha = [p["algorithm"] for p in tried if p["algorithm"].get("alpha") == top.get("alpha")]
    paces = {round(a.get(PACE) or 0.0, 6) for a in at_alpha}
    candidates = [round(n * step_s, 6) for n in PACE_STEPS]
    fresh = [c for c in candidates if c not in paces]
    if not fresh:
        slowest, current = max(paces), round(top.get(PACE) or 0.0, 6)
        extended = sum(1 for v in paces if v > max(candidates))
        if current != slowest or extended >= EXTEND:
            return None
        fresh = [round(2 * slowest, 6)]
    pace = fresh[0]
    label = f"alpha.target={top['alpha']['target']:g},{PACE}={pace:g}"
    return label, {**top, PACE: pace}
