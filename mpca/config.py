"""Typed, validated configuration of a training job (YAML file + ``key=value`` overrides).

Every mistake — an unknown key, a wrong type, an impossible value — becomes one
:class:`~mpca.errors.UserError` line naming the key and the fix.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mpca.algorithm import AlphaSchedule, BetaSchedule, GammaSchedule, MPCAHyper
from mpca.errors import UserError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunSection(_Strict):
    name: str = "mpca-run"
    output_dir: str = "runs/latest"


class DataSection(_Strict):
    dataset: Optional[Literal["digits", "mnist5k"]] = Field("digits", description="a bundled dataset")
    path: Optional[str] = Field(None, description="Parquet file/directory or URI (instead of dataset)")
    features: str = "features"
    label: str = "label"
    input_shape: List[int] = Field(default_factory=lambda: [1, 8, 8])
    holdout: float = Field(0.1, ge=0.0, lt=1.0)
    holdout_max_rows: int = Field(5000, ge=1)
    partitions: int = Field(4, ge=1)

    @field_validator("input_shape")
    @classmethod
    def _shape(cls, v):
        if not v or any(d < 1 for d in v):
            raise ValueError("every dimension must be >= 1, e.g. [1, 8, 8]")
        return v

    @model_validator(mode="after")
    def _source(self):
        if (self.dataset is None) == (self.path is None):
            raise ValueError("give exactly one of data.dataset (digits, mnist5k) or data.path (Parquet)")
        return self


class ModelSection(_Strict):
    name: str = Field("small_cnn", description="small_cnn | resnet | mlp | 'package.module:function'")
    args: Dict[str, Any] = Field(default_factory=dict)


class OptimizerSection(_Strict):
    name: Literal["adam", "sgd", "adamw"] = "adam"
    lr: float = Field(1e-3, gt=0.0, le=10.0)
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)


class TrainingSection(_Strict):
    agents: int = Field(2, ge=1)
    batch_size: int = Field(64, ge=1)
    use_gpus: Optional[bool] = None


class AlphaSection(_Strict):
    hold_cycles: int = Field(3, ge=0)
    peak: float = Field(0.5, ge=0.0, le=1.0)
    decay_cycles: int = Field(20, ge=0)
    target: float = Field(0.05, ge=0.0, le=1.0)


class BetaSection(_Strict):
    start: float = Field(1.0, gt=0.0, le=1.0)
    target: float = Field(0.9, gt=0.0, le=1.0)
    ramp_cycles: int = Field(20, ge=0)


class GammaSection(_Strict):
    start: float = Field(0.0, ge=0.0, le=4.0)
    target: float = Field(0.7, ge=0.0, le=4.0)
    ramp_cycles: int = Field(30, ge=0)


class AlgorithmSection(_Strict):
    name: Literal["mpca"] = "mpca"
    shards: int = Field(3, ge=1)
    delta: float = Field(0.8, ge=0.0, le=1.0)
    buffers: Literal["average", "local"] = "average"
    min_cycle_interval_s: float = Field(0.0, ge=0.0, description="0 = exchange as fast as possible (the paper)")
    alpha: AlphaSection = Field(default_factory=AlphaSection)
    beta: BetaSection = Field(default_factory=BetaSection)
    gamma: GammaSection = Field(default_factory=GammaSection)

    def hyper(self) -> MPCAHyper:
        return MPCAHyper(alpha=AlphaSchedule(**self.alpha.model_dump()), beta=BetaSchedule(**self.beta.model_dump()),
                         gamma=GammaSchedule(**self.gamma.model_dump()), delta=self.delta)


class StopSection(_Strict):
    max_cycles: Optional[int] = Field(None, ge=1)
    max_seconds: Optional[float] = Field(None, gt=0)
    max_epochs: Optional[float] = Field(None, gt=0)
    target_error: Optional[float] = Field(None, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _some(self):
        if all(v is None for v in (self.max_cycles, self.max_seconds, self.max_epochs, self.target_error)):
            raise ValueError("set at least one of stop.max_cycles, stop.max_seconds, stop.max_epochs, stop.target_error")
        return self


class EvalSection(_Strict):
    every_cycles: Optional[int] = Field(5, ge=1)
    every_seconds: Optional[float] = Field(None, gt=0)


class CheckpointSection(_Strict):
    dir: Optional[str] = Field(None, description="local path or URI (file://, hdfs://, s3://); default <output_dir>/checkpoints")
    every_cycles: int = Field(20, ge=1)
    keep: int = Field(3, ge=1)
    resume: bool = False
    init_from: Optional[str] = Field(None, description="a previous run's model.pt or checkpoint to start from")


class ClusterSection(_Strict):
    master: str = Field("local-cluster[2,2,1024]", description="local-cluster[K,C,MB] or 'existing' (spark-submit)")
    executor_wait_s: float = Field(60.0, gt=0)
    agent_start_timeout_s: float = Field(180.0, gt=0)
    conf: Dict[str, str] = Field(default_factory=dict)

    @field_validator("master")
    @classmethod
    def _master(cls, v):
        import re

        if v == "existing" or re.fullmatch(r"local-cluster\[\d+,\d+,\d+\]", v.replace(" ", "")):
            return v.replace(" ", "")
        if v.startswith("local"):
            raise ValueError("use local-cluster[K,2,1024] (plain local[*] has no executors for agents)")
        raise ValueError("use 'existing' (the session of spark-submit/the notebook) or local-cluster[K,C,MB]")


class JobConfig(_Strict):
    run: RunSection = Field(default_factory=RunSection)
    data: DataSection = Field(default_factory=DataSection)
    model: ModelSection = Field(default_factory=ModelSection)
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    training: TrainingSection = Field(default_factory=TrainingSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    stop: StopSection = Field(default_factory=lambda: StopSection(max_cycles=100))
    eval: EvalSection = Field(default_factory=EvalSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    progress: Literal["auto", "bar", "log", "off"] = "auto"
    seed: int = 0

    @model_validator(mode="after")
    def _fits(self):
        import re

        m = re.fullmatch(r"local-cluster\[(\d+),(\d+),(\d+)\]", self.cluster.master)
        if m:
            execs, cores = int(m.group(1)), int(m.group(2))
            if cores < 2:
                raise ValueError(f"cluster.master gives executors {cores} core(s); agents need 2 (use local-cluster[K,2,MB])")
            if self.training.agents > execs:
                raise ValueError(f"training.agents={self.training.agents} but cluster.master has {execs} executor(s); "
                                 f"lower training.agents or raise K in local-cluster[K,...]")
        return self


def _format_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-after"))
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return f"unknown configuration key '{loc}': remove it or check its spelling"
    if err["type"] == "literal_error":
        return f"configuration key '{loc}': {msg} (got {err.get('input')!r})"
    where = f"configuration key '{loc}'" if loc else "configuration"
    return f"{where}: {msg} (got {err.get('input')!r})" if loc else f"{where}: {msg}"


def _parse_value(text: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_override(data: Dict[str, Any], item: str) -> None:
    if "=" not in item:
        raise UserError(f"override {item!r} is not key=value, e.g. training.agents=2")
    key, value = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise UserError(f"override key {key!r} is malformed, e.g. training.agents=2")
    node = data
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise UserError(f"override {key!r}: '{p}' is not a section")
        node = nxt
    node[parts[-1]] = _parse_value(value)


def _deep_merge(base: Dict[str, Any], extra: Dict[str, Any]) -> Dict[str, Any]:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_merge(base[k], v)
        else:
            base[k] = v
    return base


def load_config(paths=None, overrides: Optional[List[str]] = None) -> JobConfig:
    """Merge the YAML files ``paths`` (later files win, e.g. a job then a cluster preset), apply the
    ``key=value`` overrides, validate."""
    data: Dict[str, Any] = {}
    if isinstance(paths, str):
        paths = [paths]
    for path in paths or []:
        _deep_merge(data, _read_yaml(path))
    for item in overrides or []:
        apply_override(data, item)
    try:
        return JobConfig.model_validate(data)
    except ValidationError as e:
        raise UserError(_format_error(e)) from None


def _read_yaml(path: str) -> Dict[str, Any]:
    if path is not None:
        if not os.path.exists(path):
            raise UserError(f"config file {path!r} does not exist; try conf/digits.yaml")
        try:
            with open(path) as f:
                data = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise UserError(f"config file {path!r} is not valid YAML{where}: {getattr(e, 'problem', e)}") from None
        if not isinstance(data, dict):
            raise UserError(f"config file {path!r} must hold a mapping of sections (run:, data:, ...)")
    return data
