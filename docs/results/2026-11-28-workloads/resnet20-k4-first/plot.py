"""The holdout error of each run of the first BatchNorm session (ResNet-20, K = 4), from their histories.

From a checkout:  .venv/bin/python docs/results/2026-11-28-workloads/resnet20-k4-first/plot.py
(writes curves.png beside this script)."""
import csv
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
RUNS = (("mpca, average", "mpca-r0"), ("Streaming DiLoCo H30, average", "streaming_diloco-H30-r0"),
        ("DiLoCo H60, average", "diloco-H60-r0"), ("mpca, local", "mpca-bn-local-r0"),
        ("mpca, recalibrate", "mpca-bn-recal-r0"), ("one agent", "single-r0"))

fig, ax = plt.subplots(figsize=(7, 4))
for label, stem in RUNS:
    rows = list(csv.DictReader(open(HERE / f"{stem}.history.csv", encoding="utf-8")))
    ax.plot([float(r["wall_s"]) for r in rows], [100 * float(r["holdout_error"]) for r in rows], label=label,
            linestyle="--" if "average" in label else "-")
ax.set_yscale("log")
ax.set_xlabel("seconds since fit")
ax.set_ylabel("holdout error, % (log)")
ax.set_title("ResNet-20, K = 4, repeat 1: BatchNorm statistics averaged, local or recalibrated", fontsize=9)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(HERE / "curves.png", dpi=100)
