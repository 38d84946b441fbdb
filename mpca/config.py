"""Typed, validated configuration of a training job (YAML file + ``key=value`` overrides).

Every mistake — an unknown key, a wrong type, an impossible value — becomes one
:class:`~mpca.errors.UserError` line naming the key and the fix.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from mpca.algorithm import Algorithm, build_algorithm
from mpca.algorithm.wire import DEFAULT_BLOCK, WireFormat
from mpca.data.synthetic import TeacherTask
from mpca.data.split import EVALUATION_ROWS
from mpca.errors import UserError
from mpca.exchange.timeouts import TASK_TIMEOUT_S
from mpca.local_cluster import parse_local_cluster
from mpca.spellings import device_speed_problem


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunSection(_Strict):
    name: str = Field("mpca-run", description="the run's name: the Spark application name of a session the job "
                      "starts, and the title of its plots")
    output_dir: str = Field("runs/latest", description="where the model, history, timeline, resolved config and "
                            "summary.json go: a local path or a URI (hdfs://, s3a://, abfss://, dbfs:/, file://)")


class DataSection(_Strict):
    """How the Trainer reads the DataFrame it is given."""

    features: str = Field("features", description="the features column: an array of numbers or an ML vector")
    label: str = Field("label", description="the label column: a class index (or an array of them, one per position)")
    input_shape: List[int] = Field(default_factory=list, description="per-row tensor shape; [] keeps it flat")
    holdout: float = Field(0.1, ge=0.0, lt=1.0, description="the share of rows held out for scoring, chosen by a "
                           "hash of each row with the run's seed (the same rows on any partitioning)")
    holdout_max_rows: int = Field(EVALUATION_ROWS, ge=1, description="the holdout rows evaluated: at most this many, "
                                  "those of the smallest row hash (the same rows every run)")
    agent_memory_mb: Optional[float] = Field(None, ge=0.0, description="an agent whose partition takes more than "
                                             "this many MB spills it to local disk once and memory-maps it "
                                             "(None: always in memory; 0: always on disk)")
    shuffle: bool = Field(False, description="deal the training rows out to the agents at random (a Spark "
                          "shuffle) instead of giving each agent whole partitions: for data ordered by label; "
                          "an executor lost mid-run then restarts every agent")
    stream: bool = Field(False, description="each agent trains on its first rows while the rest arrive (its ramp "
                         "draws from a doubling prefix; mpca.data.stream) instead of reading all of them first; "
                         "the load then shares the executors' cores with training (not with agent_memory_mb)")

    @field_validator("input_shape")
    @classmethod
    def _shape(cls, v):
        if any(d < 1 for d in v):
            raise ValueError("every dimension must be >= 1, e.g. [1, 8, 8]")
        return v


class TeacherSection(_Strict):
    """The synthetic task ``data.dataset: teacher`` (:mod:`mpca.data.synthetic`): rows generated on the
    executors from their index, labelled by a random tanh teacher; everything follows from ``seed``."""

    rows: int = Field(TeacherTask.rows, ge=1, description="rows generated")  # the task's own defaults, named once (mpca.data.synthetic)
    features: int = Field(TeacherTask.features, ge=1, description="standard-normal features per row")
    classes: int = Field(TeacherTask.classes, ge=2, description="classes the teacher network labels rows with")
    hidden: int = Field(TeacherTask.hidden, ge=1, description="width of the teacher's tanh hidden layer")
    seed: int = Field(TeacherTask.seed, description="the seed every row and the teacher follow from")


class TextSection(_Strict):
    """The text corpus ``data.dataset: pytext`` (:mod:`mpca.data.text`): byte windows of a directory's text
    files (default: the running Python's standard library), split into training and holdout by file
    (``data.holdout`` of the files, ``seed``)."""

    root: Optional[str] = Field(None, description="directory of text files (None: the Python standard library)")
    suffix: str = Field(".py", min_length=1, description="which files of root are text")
    window: int = Field(128, ge=2, description="tokens (bytes) per row; the labels are the next bytes")
    max_mb: Optional[float] = Field(None, gt=0, description="a deterministic subset of whole files of at most "
                                    "this many MB (None: every file)")


class JobDataSection(DataSection):
    """A job's data: a bundled dataset, a path Spark reads with ``format``, or a catalog table."""

    dataset: Optional[Literal["digits", "mnist5k", "teacher", "pytext"]] = Field(
        "digits", description="a bundled dataset, 'teacher': a synthetic task generated on the executors, or "
        "'pytext': byte windows of the Python standard library's source (a language-model corpus)")
    teacher: TeacherSection = Field(default_factory=TeacherSection, description="the synthetic task of "
                                    "data.dataset: teacher")
    text: TextSection = Field(default_factory=TextSection, description="the text corpus of data.dataset: pytext")
    path: Optional[str] = Field(None, description="file/directory or URI that Spark reads with data.format")
    holdout_path: Optional[str] = Field(None, description="the rows to score on, read as data.path is (e.g. the "
                                        "holdout/ of `mpca data pytext`): replaces the hash split of data.holdout")
    table: Optional[str] = Field(None, description="a catalog table (Hive metastore; Unity Catalog: cat.schema.table)")
    format: str = Field("parquet", pattern=r"^[A-Za-z][\w.]*$", description="the Spark data source of data.path: "
                        "parquet, csv, json, orc, delta (where installed), avro, ...")
    options: Dict[str, str] = Field(default_factory=dict, description="reader options, e.g. {header: 'true', "
                                    "inferSchema: 'true'} for CSV")
    feature_columns: Optional[List[str]] = Field(None, min_length=1, description="numeric columns assembled into "
                                                 "the features array (tabular sources such as CSV)")
    input_shape: List[int] = Field(default_factory=lambda: [1, 8, 8], description="per-row tensor shape (the "
                                   "model's input), e.g. [1, 8, 8] for the digits; [] keeps it flat")
    partitions: int = Field(4, ge=1, description="partitions of the data the job generates (teacher, bundled data "
                            "sets): at least training.agents of them")

    @model_validator(mode="after")
    def _source(self):
        if (self.path is not None or self.table is not None) and "dataset" not in self.model_fields_set:
            object.__setattr__(self, "dataset", None)  # a path or table replaces the default bundled dataset
        if sum(x is not None for x in (self.dataset, self.path, self.table)) != 1:
            raise ValueError("give exactly one of data.dataset (digits, mnist5k), data.path (with data.format) "
                             "or data.table; set the others to null")
        if self.dataset == "teacher" and list(self.input_shape) != [self.teacher.features]:
            raise ValueError(f"data.dataset teacher has rows of data.teacher.features={self.teacher.features} "
                             f"values: set data.input_shape to [{self.teacher.features}]")
        if self.dataset == "pytext" and list(self.input_shape) != [self.text.window]:
            raise ValueError(f"data.dataset pytext has rows of data.text.window={self.text.window} tokens: set "
                             f"data.input_shape to [{self.text.window}]")
        if self.holdout_path is not None and self.path is None:
            raise ValueError("data.holdout_path goes with data.path (read the same way); data.dataset pytext "
                             "splits its own holdout by file")
        return self


class ModelSection(_Strict):
    name: str = Field("small_cnn", description="small_cnn | resnet | mlp | 'package.module:function'")
    args: Dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the model's constructor "
                                 "or function")


class OptimizerSection(_Strict):
    name: Literal["adam", "sgd", "adamw"] = Field("adam", description="the torch optimizer each agent steps with")
    lr: float = Field(1e-3, gt=0.0, le=10.0, description="the optimizer's learning rate")
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="momentum (sgd)")
    weight_decay: float = Field(0.0, ge=0.0, description="weight decay")


class TrainingSection(_Strict):
    agents: int = Field(2, ge=1, description="how many agents (one Spark task each); a range MIN-MAX (e.g. 2-4) "
                        "makes the run elastic: it starts once MIN are up and the others join as Spark finds them "
                        "room")
    batch_size: int = Field(64, ge=1, description="rows per mini-batch of each agent's local step")
    use_gpus: Optional[bool] = Field(None, description="train the agents on GPUs (None: where the executors have "
                                     "them)")
    agent_cpus: Optional[List[int]] = Field(None, description="pin each agent's training thread to these CPU "
                                            "numbers (e.g. keep a core for it alone); None: no pinning")
    min_agents: int = Field(1, ge=1, description="fewer agents answering than this for cluster.agent_lost_timeout_s "
                            "fails the run (lost agents are otherwise left out of the reduction until they return)")
    lock_step: Optional[int] = Field(None, ge=1, description="a reproducible run: each agent takes exactly this "
                                     "many steps per exchange cycle, then waits until the cycle has taken its "
                                     "contribution and handed it the cycle's broadcast (mpca.exchange.lock_step); "
                                     "with cluster.reduce: ordered the joint model is the same bit for bit in "
                                     "every run and in mpca simulate. Training pauses for every exchange; None: "
                                     "the paper's agents, which never pause")
    timeline_window: int = Field(1000, ge=1, description="cycles of the exchange timeline the driver keeps in "
                                 "memory (~3 KB each); older ones go to a temporary file, and timeline.csv and "
                                 "FitResult.timeline.to_pandas() still hold every cycle")
    elastic: bool = Field(False, description="start once min_agents agents are up; the others (up to agents) join "
                          "from the joint model when Spark gives their tasks a slot (dynamic allocation, a worker "
                          "added); set by agents: MIN-MAX")

    @model_validator(mode="before")
    @classmethod
    def _agents_range(cls, data: Any) -> Any:
        """``agents: 2-4`` (or ``[2, 4]``): agents=4, min_agents=2, elastic."""
        if not isinstance(data, dict):
            return data
        value = data.get("agents")
        if isinstance(value, str) and "-" in value:
            bounds = value.split("-", 1)
        elif isinstance(value, (list, tuple)):
            bounds = list(value)
        else:
            return data
        try:
            lo, hi = (int(str(b).strip()) for b in bounds)
        except ValueError:
            raise ValueError(f"training.agents={value!r}: give a count (4) or a range MIN-MAX (2-4)") from None
        if not 1 <= lo <= hi:
            raise ValueError(f"training.agents={value!r}: a range needs 1 <= MIN <= MAX, e.g. 2-4")
        if data.get("min_agents") not in (None, lo):
            raise ValueError(f"training.agents={value!r} sets min_agents={lo}; drop training.min_agents="
                             f"{data['min_agents']}")
        return {**data, "agents": hi, "min_agents": lo, "elastic": lo < hi}

    @property
    def start_agents(self) -> int:
        """How many agents the run waits for before it starts: all of them, or MIN of an elastic range."""
        return self.min_agents if self.elastic else self.agents

    @model_validator(mode="after")
    def _min_agents_fit(self):
        if self.min_agents > self.agents:
            raise ValueError(f"training.min_agents={self.min_agents} exceeds training.agents={self.agents}")
        return self


class EmulationSection(_Strict):
    """Benchmarks only: the emulated devices that ``mpca bench compare``, ``simulate`` and ``plan`` model a user's
    accelerators with (:class:`mpca.exchange.device.DeviceClock`); a real training run leaves it empty."""

    device_step_s: Optional[float] = Field(None, gt=0, description="an emulated accelerator per agent — every "
                                           "training step takes this wall time (the real step runs, then the agent "
                                           "waits out the rest, serving the exchange meanwhile); steps slower than "
                                           "it are counted late; None: off")
    device_speed: Dict[int, float] = Field(default_factory=dict, description="agents whose emulated device is "
                                           "slower, e.g. {1: 0.5} (a straggler: its steps take device_step_s / "
                                           "0.5); needs device_step_s")

    @model_validator(mode="after")
    def _speeds_need_a_step(self):
        if self.device_speed and self.device_step_s is None:
            raise ValueError("emulation.device_speed needs emulation.device_step_s (the emulated device's step time)")
        problem = device_speed_problem(self.device_speed)
        if problem:
            raise ValueError(problem)
        return self


# keys that moved, where the old spelling was public: (section, key) → the new SECTION.KEY, refused in one line
MOVED = {("training", "device_step_s"): "emulation.device_step_s",
         ("training", "device_speed"): "emulation.device_speed"}


class WireSection(_Strict):
    """How every algorithm's exchanged values cross the network (:mod:`mpca.algorithm.wire`): ``fp32`` as they
    are (bit-exact); ``bf16``; ``int8`` or ``int4`` with a float32 scale per block of ``block`` values.  Lossy
    formats use error feedback (each sender adds what its last message of the same shard lost)."""

    format: Optional[WireFormat] = Field(None, description="fp32, bf16, int8 or int4 (None: the algorithm's "
                                         "default: int8 for mpca, int4 for streaming_diloco, fp32 otherwise)")
    block: int = Field(DEFAULT_BLOCK, ge=64, description="values per quantisation block (int8, int4)")

    def resolved(self, algorithm: Algorithm) -> str:
        """The format a run of ``algorithm`` uses: ``format``, or the algorithm's default."""
        return algorithm.wire_format(self.format)


class StopSection(_Strict):
    max_cycles: Optional[int] = Field(None, ge=1, description="stop after this many exchange cycles")
    max_seconds: Optional[float] = Field(None, gt=0, description="stop after this many seconds of the run's clock")
    max_epochs: Optional[float] = Field(None, gt=0, description="stop after the agents have seen their rows this "
                                        "many times")
    target_error: Optional[float] = Field(None, ge=0.0, le=1.0, description="stop once the holdout error is at "
                                          "most this (eval.metric: error)")
    target_loss: Optional[float] = Field(None, gt=0.0, description="stop once the holdout loss (nats per label, "
                                         "e.g. per token) is at most this (eval.metric: loss)")

    @model_validator(mode="after")
    def _some(self):
        if all(v is None for v in (self.max_cycles, self.max_seconds, self.max_epochs, self.target_error,
                                   self.target_loss)):
            raise ValueError("set at least one of stop.max_cycles, stop.max_seconds, stop.max_epochs, "
                             "stop.target_error, stop.target_loss")
        if self.target_error is not None and self.target_loss is not None:
            raise ValueError("give one target: stop.target_error (eval.metric: error) or stop.target_loss "
                             "(eval.metric: loss)")
        return self

    @property
    def target(self) -> Optional[float]:
        """The target of the run's metric (error or loss), whichever is set."""
        return self.target_error if self.target_error is not None else self.target_loss


class EvalSection(_Strict):
    every_cycles: Optional[int] = Field(5, ge=1, description="score the joint model on the holdout every this many "
                                        "cycles (after cycles 1, 2, 4, 8 ... before that)")
    every_seconds: Optional[float] = Field(None, gt=0, description="score the joint model at most this often, in "
                                           "seconds (for long runs)")
    metric: Literal["error", "loss"] = Field("error", description="what the progress, the plots, the target and "
                                             "the trackers follow: the holdout's classification error, or its "
                                             "loss (a language model's nats per token; bits beside it)")
    calibration_rows: int = Field(512, ge=1, description="training rows the driver keeps to re-estimate BatchNorm "
                                  "statistics before each score and the saved model (algorithm.buffers local or "
                                  "recalibrate; every score passes them through the model once)")


class CheckpointSection(_Strict):
    dir: Optional[str] = Field(None, description="local path or URI (file://, hdfs://, s3://); jobs: <output_dir>/checkpoints")
    every_cycles: int = Field(20, ge=1, description="write a checkpoint every this many cycles")
    every_seconds: Optional[float] = Field(300.0, gt=0, description="also write one when this many seconds have "
                                           "passed since the last (or the run's start), however few cycles ran: a "
                                           "driver that dies loses at most this much (None: by cycles only)")
    keep: int = Field(3, ge=1, description="how many of the newest checkpoints are kept")
    resume: bool = Field(False, description="continue from the newest valid checkpoint in checkpoint.dir (also "
                         "with another number of agents)")
    init_from: Optional[str] = Field(None, description="a previous run's model.pt or checkpoint to start from")

    @model_validator(mode="after")
    def _resume_needs_dir(self):
        if self.resume and self.dir is None:
            raise ValueError("checkpoint.resume needs checkpoint.dir")
        return self


class ClusterSection(_Strict):
    master: str = Field("existing", description="local-cluster[K,C,MB], 'existing' (the active session) or "
                        "sc://HOST:PORT (a Spark Connect server)")
    executor_wait_s: float = Field(60.0, gt=0, description="seconds to wait for executors with room for the agents "
                                   "(one executor each, or fewer with several GPUs or agent slots each)")
    agent_start_timeout_s: float = Field(180.0, gt=0, description="how long the driver waits for the agents to "
                                         "start and answer before the run fails")
    agent_wait_s: Optional[float] = Field(None, gt=0, description="how long a cycle waits for a silent (hung or "
                                          "lost) agent before going on without it (None: 5 x the median recent "
                                          "cycle, within 2-10 s)")
    agent_lost_timeout_s: float = Field(120.0, gt=0, description="fewer than training.min_agents answering for "
                                        "this long fails the run (Spark's retry of a lost agent takes ~20-60 s)")
    cycle_deadline_s: Optional[float] = Field(None, ge=0, description="a cycle's exchange job running longer is "
                                              "abandoned (cancelled; its contributions carry over to the next "
                                              "cycle): an executor cut off from the driver (a link down) holds a "
                                              "task Spark cannot start or hear from until spark.network.timeout, "
                                              "and with it every agent's exchange (None: 2 x cluster.agent_wait_s "
                                              "+ 4 x the median recent cycle, from the 6th cycle on, a resumed "
                                              "run's from its first with the checkpoint's cycle times, doubled "
                                              "for each cycle abandoned in a row; 0: never)")
    service_host: Optional[str] = Field(None, description="address executors reach the driver's parameter service "
                                        "at (default: spark.driver.host)")
    service_port: int = Field(0, ge=0, le=65535, description="port of the parameter service (0: any free port)")
    connect_dir: Optional[str] = Field(None, description="a Spark Connect session's runs: a directory the client "
                                       "and the executors both reach (a Databricks volume /Volumes/..., a cloud "
                                       "path s3://...), where the run's coordinator and agents find each other and "
                                       "its progress and result come back (default: a temporary directory, where "
                                       "the cluster runs on the client's machine)")
    client_gone_s: float = Field(60.0, gt=0, description="a Spark Connect run: how long its coordinator goes on "
                                 "without word from the client (it says it is there every few seconds) before it "
                                 "stops the run as interrupted, writing its checkpoint and result (a client's "
                                 "session dying does not end the jobs it started)")
    gpus: Any = Field("auto", description="GPUs per executor of a local-cluster master: auto (one when this host "
                      "has CUDA devices, the agents then train on them, sharing them when fewer than the executors), "
                      "none, or a number; another cluster's GPUs come from its own spark.executor.resource.gpu.*")
    exchange_jobs: Literal["auto", "one", "two"] = Field(
        "auto", description="with one exchange task slot per agent (executors of 2 cores), how a cycle that "
        "broadcasts reaches the agents: one task per agent that yields after the broadcast's download, two jobs "
        "(reduce, then deliver on the same slot), or auto: measured on the run's cycles, the faster kept")
    reduce: Literal["tree", "scatter", "ordered"] = Field(
        "tree", description="how a cycle sums the agents' contributions: tree (Spark's treeReduce: every "
        "contribution into the driver), scatter (a reduce-scatter over the executors in a shuffle: each "
        "executor's port carries most of a shard, the driver's one shard instead of K; costs a second stage, "
        "which waits for a task slot) or ordered (every contribution into the driver, which adds them in agent "
        "order: the same bits whatever the tasks' placement and finishing order; with training.lock_step a "
        "reproducible run)")
    task_timeout_s: float = Field(TASK_TIMEOUT_S, gt=0, description="how long an exchange task waits for its agent's "
                                  "answer (a round's end included) before it fails and Spark retries it")
    conf: Dict[str, str] = Field(default_factory=dict, description="Spark configuration for a session mpca "
                                 "starts, e.g. {spark.broadcast.blockSize: 256k}")

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v):
        if v in ("auto", "none"):
            return v
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"cluster.gpus is auto, none or a whole number of GPUs per executor (got {v!r})")
        return v

    @field_validator("master")
    @classmethod
    def _master(cls, v):
        local = parse_local_cluster(v)
        if local is not None:
            return local.master
        if v == "existing":
            return v
        if v.startswith("sc://"):  # a Spark Connect server: the run's driver side goes into the cluster
            if not re.fullmatch(r"sc://[^/:;\s]+(:\d{1,5})?/?(;[^\s]*)?", v):
                raise ValueError(f"{v!r} is not a Spark Connect address: sc://HOST[:PORT][/;param=value;...]")
            return v
        if v.startswith("local"):
            raise ValueError("use local-cluster[K,2,1024] (plain local[*] has no executors for agents)")
        raise ValueError("use 'existing' (the session of spark-submit/the notebook, or SPARK_REMOTE's Spark Connect "
                         "server), sc://HOST:PORT (a Spark Connect server) or local-cluster[K,C,MB]")


class JobClusterSection(ClusterSection):
    master: str = Field("local-cluster[2,2,1024]", description="local-cluster[K,C,MB], 'existing' (spark-submit, "
                        "or the Spark Connect server SPARK_REMOTE names) or sc://HOST:PORT (a Spark Connect server)")


class Settings(_Strict):
    """Everything a training run needs besides the model, loss and optimizer: validated once, passed down whole.

    ``algorithm`` is the chosen algorithm's own typed settings (``name`` picks it, see
    :mod:`mpca.algorithm.registry`)."""

    training: TrainingSection = Field(default_factory=TrainingSection, description="the agents and their local "
                                      "steps")
    data: DataSection = Field(default_factory=DataSection, description="how the data is read and split")
    algorithm: SerializeAsAny[Algorithm] = Field(default_factory=lambda: build_algorithm("mpca"), description="the "
                                                 "algorithm (name) and its own settings")
    stop: StopSection = Field(default_factory=lambda: StopSection(max_cycles=100), description="when the run stops")
    eval: EvalSection = Field(default_factory=EvalSection, description="when and how the joint model is scored")
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection, description="checkpoints of the joint "
                                          "model and the driver's state")
    cluster: ClusterSection = Field(default_factory=ClusterSection, description="the Spark cluster and the exchange")
    wire: WireSection = Field(default_factory=WireSection, description="how exchanged values cross the network")
    emulation: EmulationSection = Field(default_factory=EmulationSection, description="benchmarks only: emulated "
                                        "devices (step time, stragglers)")
    progress: Literal["auto", "bar", "log", "notebook", "off"] = Field("auto", description="the progress display: "
                                                                       "auto picks a notebook line, a terminal "
                                                                       "line or a log line every 10 s")
    seed: int = Field(0, description="the run's seed: the initial model, the holdout split, the batch order")

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """A key of :data:`MOVED` in its old place: one line naming the new one."""
        if isinstance(data, dict):
            for (section, key), new in MOVED.items():
                if isinstance(data.get(section), dict) and key in data[section]:
                    raise ValueError(f"{section}.{key} is now {new} (the benchmark's emulation has its own section)")
        return data

    @field_validator("algorithm", mode="before")
    @classmethod
    def _algorithm(cls, v):
        return build_algorithm(v)

    @field_validator("progress", mode="before")
    @classmethod
    def _progress_off(cls, v):
        return "off" if v is False else v  # YAML reads a bare `off` as false

    @model_validator(mode="after")
    def _fits(self):
        self.algorithm.check_agents(self.training.agents)
        self._lock_step_fits()
        if self.stop.target_loss is not None and self.eval.metric != "loss":
            raise ValueError("stop.target_loss needs eval.metric: loss (the metric is error; use stop.target_error "
                             "or set eval.metric: loss)")
        if self.stop.target_error is not None and self.eval.metric != "error":
            raise ValueError("stop.target_error needs eval.metric: error (the metric is loss; use stop.target_loss)")
        local = parse_local_cluster(self.cluster.master)
        if local is not None:
            execs, cores = local.executors, local.cores
            if cores < 2:
                raise ValueError(f"cluster.master gives executors {cores} core(s); agents need 2 (use local-cluster[K,2,MB])")
            if self.training.start_agents > execs:
                raise ValueError(f"training.agents={self.training.start_agents} but cluster.master has {execs} "
                                 f"executor(s); lower training.agents or raise K in local-cluster[K,...]")
        return self

    def _lock_step_fits(self) -> None:
        """``training.lock_step`` paces agents that never wait for the driver (mpca): not a collective's, not the
        parameter service's, not those that pause for the driver's model themselves."""
        if self.training.lock_step is None:
            return
        problem = self.algorithm.lock_step_problem()
        if problem:
            raise ValueError(problem)
        if self.data.stream:
            raise ValueError("training.lock_step needs every row before the first step (its ramp depends on when "
                             "rows arrive): set data.stream: false")


class MLflowSection(_Strict):
    """MLflow tracking of a job (without this section: on where MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME,
    MLFLOW_EXPERIMENT_ID or MLFLOW_RUN_ID is set or an MLflow run is active, as if ``mlflow: {}`` were given)."""

    experiment: Optional[str] = Field(None, description="None: MLFLOW_EXPERIMENT_NAME/_ID or the default experiment")
    tracking_uri: Optional[str] = Field(None, description="e.g. databricks, http://host:5000, file:/path (None: "
                                        "MLFLOW_TRACKING_URI or ./mlruns)")
    run_name: Optional[str] = Field(None, description="the MLflow run's name")
    register_as: Optional[str] = Field(None, description="register the logged model in the MLflow model registry "
                                       "under this name (a new version each run); Unity Catalog: catalog.schema.model")

    @field_validator("register_as")
    @classmethod
    def _model_name(cls, v):
        if v is not None and (not v.strip() or "/" in v or ":" in v):
            raise ValueError("a registered model's name: not empty, without '/' or ':' (e.g. digits-cnn)")
        return v


class TensorBoardSection(_Strict):
    dir: str = Field("runs/tensorboard", description="the TensorBoard log directory")


class TrackingSection(_Strict):
    mlflow: Optional[MLflowSection] = Field(None, description="log the job to MLflow (pip install 'mpca[mlflow]')")
    tensorboard: Optional[TensorBoardSection] = Field(None, description="log the job's metrics for TensorBoard "
                                                      "(pip install 'mpca[tensorboard]')")


class JobConfig(Settings):
    """A job: the run's settings plus what the CLI builds itself (output, data source, model, optimizer)."""

    run: RunSection = Field(default_factory=RunSection, description="the run's name and outputs")
    data: JobDataSection = Field(default_factory=JobDataSection, description="the data source, how it is read and "
                                 "split")
    model: ModelSection = Field(default_factory=ModelSection, description="the model to train")
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection, description="each agent's local optimizer")
    cluster: JobClusterSection = Field(default_factory=JobClusterSection, description="the Spark cluster and the "
                                       "exchange")
    progress: Literal["auto", "bar", "log", "notebook", "off"] = Field("auto", description="the progress display: "
                                                                       "auto picks a notebook line, a terminal "
                                                                       "line or a log line every 10 s")
    tracking: TrackingSection = Field(default_factory=TrackingSection, description="experiment tracking (MLflow, "
                                      "TensorBoard)")

    @model_validator(mode="before")
    @classmethod
    def _checkpoints_beside_outputs(cls, data):
        """A job's checkpoints go to ``<run.output_dir>/checkpoints`` unless ``checkpoint.dir`` says otherwise."""
        if isinstance(data, dict):
            ck = data.get("checkpoint")
            if ck is None or (isinstance(ck, dict) and ck.get("dir") is None):
                out = (data.get("run") or {}).get("output_dir", RunSection().output_dir)
                data = {**data, "checkpoint": {**(ck or {}), "dir": os.path.join(str(out), "checkpoints")}}
        return data


# Trainer keyword → settings key: the friendly flat API over the one settings object
SHORTCUTS = {
    "agents": "training.agents", "batch_size": "training.batch_size", "use_gpus": "training.use_gpus",
    "features": "data.features", "label": "data.label", "input_shape": "data.input_shape",
    "holdout": "data.holdout", "holdout_max_rows": "data.holdout_max_rows", "stream": "data.stream",
    "shards": "algorithm.shards", "buffers": "algorithm.buffers", "min_cycle_interval_s": "algorithm.min_cycle_interval_s",
    "max_cycles": "stop.max_cycles", "max_seconds": "stop.max_seconds", "max_epochs": "stop.max_epochs",
    "target_error": "stop.target_error", "target_loss": "stop.target_loss", "metric": "eval.metric",
    "eval_every_cycles": "eval.every_cycles",
    "eval_every_seconds": "eval.every_seconds", "checkpoint_dir": "checkpoint.dir",
    "checkpoint_every": "checkpoint.every_cycles", "checkpoint_keep": "checkpoint.keep",
    "resume": "checkpoint.resume", "init_from": "checkpoint.init_from",
    "executor_wait_s": "cluster.executor_wait_s", "agent_start_timeout_s": "cluster.agent_start_timeout_s",
    "service_host": "cluster.service_host", "service_port": "cluster.service_port",
    "connect_dir": "cluster.connect_dir", "client_gone_s": "cluster.client_gone_s",
    "min_agents": "training.min_agents", "agent_wait_s": "cluster.agent_wait_s",
    "agent_lost_timeout_s": "cluster.agent_lost_timeout_s", "timeline_window": "training.timeline_window",
    "device_step_s": "emulation.device_step_s", "wire": "wire.format",
}


def settings_from(base: Optional[Settings] = None, **options) -> Settings:
    """``base`` (or the defaults) with ``options`` applied: a section name (``stop={...}``), ``algorithm``
    (a name, a mapping or an :class:`Algorithm`) or a shortcut (``agents=2``, ``max_cycles=30``, see
    :data:`SHORTCUTS`).  Raises :class:`UserError` naming the bad key."""
    data: Dict[str, Any] = base.model_dump() if base is not None else {}
    if base is not None:
        data["algorithm"] = base.algorithm.model_dump()
    stop_given = False
    for key, value in options.items():
        if key == "algorithm":
            if isinstance(value, Algorithm):
                value = value.model_dump()
            elif isinstance(value, str):
                value = {"name": value}
            algo = data.get("algorithm") or {}
            if isinstance(value, dict) and value.get("name", algo.get("name")) != algo.get("name"):
                algo = {k: v for k, v in algo.items() if k in ("buffers", "min_cycle_interval_s")}
            data["algorithm"] = {**algo, **value}
        elif key in SHORTCUTS and not (key in Settings.model_fields and isinstance(value, (dict, BaseModel))):
            section, name = SHORTCUTS[key].split(".")
            data.setdefault(section, {})[name] = value
            stop_given = stop_given or section == "stop"
        elif key in Settings.model_fields:
            data[key] = value.model_dump() if isinstance(value, BaseModel) else value
            stop_given = stop_given or key == "stop"
        else:
            raise UserError(f"unknown option {key!r}; use a settings section or one of {', '.join(sorted(SHORTCUTS))}")
    if base is None and not stop_given:
        data.setdefault("stop", {"max_cycles": 100})
    cls = type(base) if base is not None else Settings
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise UserError(_format_error(e)) from None


def _format_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-after"))
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        return f"unknown configuration key '{loc}': remove it or check its spelling"
    if err["type"] == "literal_error":
        return f"configuration key '{loc}': {msg} (got {err.get('input')!r})"
    where = f"configuration key '{loc}'" if loc else "configuration"
    got = repr(err.get("input"))
    return f"{where}: {msg} (got {got})" if loc and len(got) <= 60 else f"{where}: {msg}"


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
        layer = _read_yaml(path)
        _later_source_wins(data, layer.get("data") if isinstance(layer.get("data"), dict) else {})
        _deep_merge(data, layer)
    for item in overrides or []:
        key = item.split("=", 1)[0].strip()
        if key.startswith("data."):
            _later_source_wins(data, {key[5:]: True})
        apply_override(data, item)
    try:
        return JobConfig.model_validate(data)
    except ValidationError as e:
        raise UserError(_format_error(e)) from None


def resolved_yaml(cfg: BaseModel) -> str:
    """The configuration as it is used — every file, override and default applied — as YAML."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, default_flow_style=False)


DATA_SOURCES = ("dataset", "path", "table")


def _later_source_wins(data: Dict[str, Any], layer_data: Dict[str, Any]) -> None:
    """A layer (a later file or an override) that names a data source replaces the source of earlier
    layers: ``-c conf/digits.yaml data.path=x.csv`` reads x.csv, not the bundled digits."""
    if any(k in layer_data for k in DATA_SOURCES) and isinstance(data.get("data"), dict):
        for k in DATA_SOURCES:
            data["data"].pop(k, None)


def _read_yaml(path: str) -> Dict[str, Any]:
    if path is not None:
        if not os.path.exists(path):
            raise UserError(f"config file {path!r} does not exist; try conf/digits.yaml")
        if os.path.isdir(path):
            raise UserError(f"config {path!r} is a directory; give a YAML file in it, e.g. conf/digits.yaml")
        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f) or {}
        except UnicodeDecodeError as e:
            raise UserError(f"config file {path!r} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
        except OSError as e:
            raise UserError(f"config file {path!r} cannot be read: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise UserError(f"config file {path!r} is not valid YAML{where}: {getattr(e, 'problem', e)}") from None
        if not isinstance(data, dict):
            raise UserError(f"config file {path!r} must hold a mapping of sections (run:, data:, ...)")
    return data
