"""``mpca simulate`` in-process: bad input is one line and exit code 2; a short run prints constants and a table."""
import json

import pytest

from mpca.cli import main


@pytest.mark.parametrize("argv, says", [
    (["simulate", "--agents", "0"], "agents"),
    (["simulate", "--link", "fast"], "--link 'fast'"),
    (["simulate", "-a", "nope"], "unknown algorithm 'nope'"),
    (["simulate", "-a", "weaksync"], "does not run weaksync"),
    (["simulate", "-a", "sync", "algorithm.every=0"], "algorithm.every"),
    (["simulate", "--wire", "int3"], "wire"),
    (["simulate", "--targets", "2"], "target errors"),
    (["simulate", "every=3"], "expected algorithm.KEY=VALUE"),
    (["simulate", "--host-cores", "0"], "host_cores"),
    (["simulate", "--exchange-cpu", "-1"], "exchange_cpu_s_per_mb"),
])
def test_bad_input_is_one_line_and_exit_code_2(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and "Traceback" not in err
    assert "simulate: simulate:" not in err, err  # said once, not wrapped twice


def test_a_short_simulation_prints_the_constants_and_writes_json(tmp_path, capsys):
    out = tmp_path / "sim.json"
    code = main(["simulate", "-k", "2", "--hidden", "16", "--rows", "200", "--max-seconds", "3", "--device-step-s", "0.1",
                 "--targets", "0.95", "--exchange-cpu", "0.06", "--host-cores", "2", "--holdout", "300", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "constants: link 100 Mbit/s" in printed and "job overhead 0.25 s" in printed
    assert "exchange CPU 0.06 s/MB on 2 shared core(s)" in printed
    assert "mpca | 2 | int8" in printed  # without --wire: the algorithm's own default
    data = json.loads(out.read_text())
    assert data["constants"]["link_bps"] == 100e6 and data["history"]
    assert data["constants"]["exchange_cpu_s_per_mb"] == 0.06 and data["constants"]["host_cores"] == 2
    assert data["settings"]["workload"]["holdout"] == 300 and data["settings"]["workload"]["rows_per_agent"] == 200
    assert data["settings"]["workload"]["seed"] == data["settings"]["seed"] == 0  # the task follows --seed


def test_the_task_seed_keeps_the_teacher_task_while_the_run_seed_changes_the_run():
    import argparse

    from mpca.sim.command import add_arguments, config_from

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from(p.parse_args(["--seed", "2", "--task-seed", "0"]))
    assert (cfg.seed, cfg.compute.seed, cfg.workload.seed) == (2, 2, 0)
    assert config_from(p.parse_args(["--seed", "2"])).workload.seed == 2


def test_holdout_split_evaluates_on_the_runtimes_holdout_and_a_bad_one_is_one_line():
    import argparse

    from mpca.errors import UserError
    from mpca.sim.command import add_arguments, config_from

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert config_from(p.parse_args([])).workload.split_rows is None  # the holdout after the agents' rows
    assert config_from(p.parse_args(["--holdout-split", "1000000"])).workload.split_rows == 1_000_000
    with pytest.raises(UserError, match="simulate: split_rows must be >= 1"):
        config_from(p.parse_args(["--holdout-split", "0"]))


def test_startup_is_the_simulations_start_up_and_a_negative_one_is_one_line():
    import argparse

    from mpca.errors import UserError
    from mpca.sim.command import add_arguments, config_from

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert config_from(p.parse_args([])).startup_s == 0.0
    assert config_from(p.parse_args(["--startup", "7.6"])).startup_s == 7.6
    with pytest.raises(UserError, match="simulate: startup_s: Input should be greater than or equal to 0"):
        config_from(p.parse_args(["--startup", "-1"]))
    starts = config_from(p.parse_args(["--agents", "2", "--startup", "6.3", "--agent-starts", "6.27,6.3"]))
    assert starts.agent_starts_s == (6.27, 6.3) and config_from(p.parse_args([])).agent_starts_s == ()
    with pytest.raises(UserError, match="agent_starts_s gives each of the 2 agents its start"):
        config_from(p.parse_args(["--agents", "2", "--startup", "6", "--agent-starts", "6.27,6.3"]))


def test_hang_and_lose_become_the_simulations_absences_and_the_table_says_who_was_away(capsys):
    import argparse

    from mpca.sim.command import add_arguments, config_from, run
    from mpca.sim.presence import Absence

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["-k", "2", "--hang", "1:2:3", "--lose", "0:4.5:2", "--agent-wait", "0.5", "--hidden", "8",
                         "--rows", "200", "--holdout", "50", "--max-seconds", "12", "--device-step-s", "0.2"])
    cfg = config_from(args)
    assert cfg.absences == (Absence(1, 2.0, 3.0, "hang"), Absence(0, 4.5, 2.0, "lost")) and cfg.agent_wait_s == 0.5
    assert run(args) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("agents away: agent 0 missing from") and "agent 1 missing from" in line
    assert "agent 0 joined from the joint model at" in line


DIGITS = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "conf" / "digits.yaml")


def test_a_runs_settings_are_the_simulations_each_where_the_run_spells_it():
    """SimConfig.from_settings: every simulated setting from the run's own section; one the run spells is refused
    as a simulator field, and what the simulator cannot run (an elastic range, no device step, scatter) is one
    line naming the setting."""
    from mpca.config import Settings
    from mpca.sim.simulator import SimConfig

    run = Settings.model_validate({
        "training": {"agents": 3, "batch_size": 16, "lock_step": 4},
        "emulation": {"device_step_s": 0.05, "device_speed": {2: 0.5}},
        "algorithm": {"name": "mpca", "shards": 2}, "wire": {"format": "bf16", "block": 128},
        "cluster": {"reduce": "ordered", "agent_wait_s": 2.5},
        "stop": {"max_cycles": 9, "max_seconds": 40, "target_loss": 1.5}, "eval": {"metric": "loss"}, "seed": 3})
    cfg = SimConfig.from_settings(run, jitter=0.1, eval_every_s=2.0)
    assert (cfg.algorithm.name, cfg.algorithm.shards, cfg.agents, cfg.batch_size, cfg.lock_step) == ("mpca", 2, 3, 16, 4)
    assert (cfg.compute.step_s, cfg.compute.speeds, cfg.compute.jitter, cfg.compute.seed) == (0.05, {2: 0.5}, 0.1, 3)
    assert (cfg.wire, cfg.wire_block, cfg.reduce, cfg.agent_wait_s) == ("bf16", 128, "ordered", 2.5)
    assert (cfg.max_cycles, cfg.max_virtual_s, cfg.targets, cfg.metric, cfg.seed) == (9, 40.0, (1.5,), "loss", 3)
    assert cfg.eval_every_s == 2.0
    with pytest.raises(ValueError, match="agents is the run's training.agents: set it there"):
        SimConfig.from_settings(run, agents=4)
    for section, says in [({"training": {"agents": "2-3"}, "emulation": {"device_step_s": 0.1}},
                           "training.agents 2-3 is a range"),
                          ({"training": {"agents": 2}}, "emulation.device_step_s is not set"),
                          ({"emulation": {"device_step_s": 0.1}, "cluster": {"reduce": "scatter"}},
                           "cluster.reduce: scatter")]:
        with pytest.raises(ValueError, match=says):
            SimConfig.from_settings(Settings.model_validate(section))


def test_the_run_settings_table_names_real_settings_fields_and_options_and_a_setting_unset_keeps_the_default():
    """mpca.sim.run_settings: each row's setting is a key of the run's settings, its field one of SimConfig's, its
    option one of mpca simulate's; a setting left unset (stop.max_seconds) leaves the field's default."""
    import argparse

    from mpca.config import Settings
    from mpca.sim.command import add_arguments
    from mpca.sim.run_settings import RUN_SETTINGS
    from mpca.sim.simulator import SimConfig

    run = Settings.model_validate({"training": {"agents": 2}, "emulation": {"device_step_s": 0.1}})
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    dests = {a.dest for a in parser._actions}
    for row in RUN_SETTINGS:
        row.value(run)  # an AttributeError names a setting the run does not have
        assert row.field in SimConfig.model_fields, row
        assert row.option is None or row.option in dests, row
    assert run.stop.max_seconds is None
    assert SimConfig.from_settings(run).max_virtual_s == SimConfig.model_fields["max_virtual_s"].default


def test_simulate_with_a_job_config_runs_the_jobs_settings_and_model(tmp_path, capsys):
    """``mpca simulate -c job.yaml SECTION.KEY=VALUE``: the settings as mpca train reads them, the job's own model
    trained on a sample of its rows."""
    out = tmp_path / "sim.json"
    code = main(["simulate", "-c", DIGITS, "--rows", "300", "--json", str(out),
                 "emulation.device_step_s=0.05", "stop.max_seconds=4", "algorithm.name=sync", "algorithm.sync.every=5"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "sync | 2 | fp32 | —" in printed and "t(0.03) s" in printed  # the job's stop.target_error: 0.03
    data = json.loads(out.read_text())
    settings = data["settings"]
    assert data["agents"] == 2 and settings["batch_size"] == 32 and settings["algorithm"]["every"] == 5
    assert settings["compute"]["step_s"] == 0.05 and data["virtual_s"] == 4.0
    # 2 × 300 rows read; the job's data.holdout (0.15) of them held out: 90, and (600 - 90) // 2 rows per agent
    assert settings["workload"] == {"name": "digits", "rows_per_agent": 255, "holdout": 90, "sample_rows": 510}


@pytest.mark.parametrize("argv, says", [
    (["--agents", "3"], "--agents and --config: the job spells it training.agents; give training.agents=VALUE"),
    (["--device-step-s", "0.1"], "the job spells it emulation.device_step_s"),
    (["--seed", "1"], "the job spells it seed"),
    (["--hidden", "16"], "--hidden is the teacher MLP's task"),
    (["emulation.device_step_s=0.1", "training.agents=0"], "training.agents"),
    (["stop.max_seconds=2"], "emulation.device_step_s is not set"),
])
def test_simulate_with_a_job_config_refuses_a_setting_given_twice_in_one_line(argv, says, capsys):
    assert main(["simulate", "-c", DIGITS, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and "Traceback" not in err, err
