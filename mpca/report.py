"""Results a person would rather look at than read: the history as CSV, a plot, a table."""
from __future__ import annotations

import logging
import math
from typing import Dict, Optional, Sequence


def strict_json(value):
    """``value`` with every NaN or infinity replaced by None, so strict JSON parsers accept the file."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def write_json(path: str, value) -> str:
    """Strict JSON (no NaN), written atomically (temporary file, then rename)."""
    import json
    import os

    with open(path + ".tmp", "w") as f:
        json.dump(strict_json(value), f, indent=2, allow_nan=False, default=str)
    os.replace(path + ".tmp", path)
    return path


def write_history_csv(history, path: str) -> str:
    cols = [c for c in ("wall_s", "cycle", "holdout_error", "holdout_loss", "holdout_bits", "samples_per_s", "epochs",
                        "agents", "resets") if c in history]
    out = history[cols].copy()
    extra = [c for c in ("weight", "agent_samples_per_s") if c in history]
    for c in extra:
        out[c] = history[c].map(_per_agent)
    out.to_csv(path, index=False)
    return path


def _per_agent(d) -> str:
    """``{agent: value}`` as ``0:12.0;1:9.5`` (rows read back from an earlier CSV are kept as they are)."""
    if isinstance(d, str):
        return d
    if not isinstance(d, dict):
        return ""
    return ";".join(f"{k}:{v:.1f}" if isinstance(v, float) else f"{k}:{v}" for k, v in sorted(d.items()))


def plot_history(history, path: str, title: str = "MPCA SGD", target: Optional[float] = None,
                 agents_up_s: Optional[float] = None, metric: str = "error") -> Optional[str]:
    """Holdout error (or loss: ``metric``) against wall time (like the paper's Fig. 13a), the agents' start-up
    shaded."""
    return plot_curves({f"holdout {metric}": history}, path, title, [target] if target is not None else [],
                       agents_up_s, metric)


def plot_curves(histories: Dict[str, object], path: str, title: str, targets: Sequence[float] = (),
                agents_up_s: Optional[float] = None, metric: str = "error") -> Optional[str]:
    """Holdout error in % (or loss in nats: ``metric``) against wall time, one curve per labelled history (e.g.
    one per algorithm), with the span before ``agents_up_s`` (the agents starting: the initial model is all
    there is) shaded; None (and a log line) without matplotlib, the ``plot`` extra."""
    try:
        import matplotlib
    except ImportError:
        logging.getLogger("mpca.report").info("no plot of %s: matplotlib is not installed (pip install 'mpca[plot]')",
                                              path)
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    column, scale = f"holdout_{metric}", 100.0 if metric == "error" else 1.0
    for label, history in histories.items():
        h = history.dropna(subset=[column])
        ax.plot(h["wall_s"], scale * h[column], marker="o", ms=3, label=label)
    if agents_up_s is not None and agents_up_s > 0:
        ax.axvspan(0, agents_up_s, color="grey", alpha=0.12, lw=0, label="agents starting")
    for i, t in enumerate(targets):
        ax.axhline(scale * t, color="grey", ls="--", lw=1, label="target" if i == 0 else None)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("holdout error (%)" if metric == "error" else "holdout loss (nats)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def summary_table(rows) -> str:
    """A small aligned table of (label, value) pairs."""
    width = max(len(k) for k, _ in rows)
    out = []
    for k, v in rows:
        if v is None:
            v = "-"
        elif isinstance(v, float):
            v = "-" if math.isnan(v) else f"{v:.4g}"
        out.append(f"  {k:<{width}}  {v}")
    return "\n".join(out)
