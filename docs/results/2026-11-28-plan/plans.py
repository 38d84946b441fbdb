"""Plans (job gradients) for the three workloads at the measured targets; prints the tables and writes JSON.

From a checkout:  python docs/results/2026-11-28-plan/plans.py [teacher lm lm24 resnet]
(ROWS=200000 SEEDS=2 for the teacher's second setting; OUT=<dir> for the JSON, default the current directory)."""
import json, os, pathlib, sys, time
ROOT = pathlib.Path(__file__).resolve().parents[3]
OUT = os.path.abspath(os.environ.get("OUT", "."))
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)  # the job configs' paths (conf/*.yaml)
from mpca.config import load_config
from mpca.models import training_functions
from mpca.sim.measure import exchanged_values
from mpca.sim.plan import PlanConfig, plan, table, gain_line
from mpca.sim.workload import job_workload

CASES = {
    "teacher": ("conf/teacher_mlp.yaml", {}, dict(target_error=0.26), 1000),
    "lm": ("conf/lm.yaml", {}, dict(target_loss=2.6), 256),
    "lm24": ("conf/lm.yaml", {}, dict(target_loss=2.4), 256),
    "resnet": ("conf/resnet20.yaml", {"batch_size": 16}, dict(target_error=0.06), 500),
}
ROWS, SEEDS = int(os.environ.get("ROWS", 50000)), int(os.environ.get("SEEDS", 1))
which = sys.argv[1:] or list(CASES)
for name in which:
    path, over, target, holdout = CASES[name]
    job = load_config([path])
    model = training_functions(job.model, job.optimizer)[0]()
    batch = over.get("batch_size", job.training.batch_size)
    cfg = PlanConfig(parameters=exchanged_values(model), device_step_s=0.3, link_bps=100e6, agents=(1, 2, 4),
                     algorithms=("single", "mpca"), wire="int8", batch_size=batch, holdout=holdout, evals=60,
                     reference_steps=2000, rows=ROWS, seeds=SEEDS, **target)
    t0 = time.time()
    work = job_workload(job, cfg.rows, cfg.holdout)
    res = plan(cfg, lambda r: print(f"  {name} {r.algorithm} K={r.agents}: {r.time_s}", flush=True), work)
    print(f"== {name} ({time.time() - t0:.0f} s wall)")
    print(table(res))
    print(gain_line(res))
    json.dump(res.to_dict(), open(os.path.join(OUT, f"plan-{name}-{ROWS}-{SEEDS}.json"), "w"), indent=1, default=str)
