"""The tables of job.toml as pydantic models ([model], [data], [lora], [train], [early_stopping],
[checkpoint], [budget], [slurm], [tracking]), and the built-in fine-tune's tasks with the metrics each reports."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .bounds import INT64_MAX, INT64_MIN, control_problem
from .problems import TomlTable


class JobTable(TomlTable):
    """A table of job.toml (the job itself is one too)."""


TaskName = Literal["sequence-classification", "causal-lm", "token-classification"]
TASK_CLASSIFY: TaskName = "sequence-classification"
TASK_CAUSAL_LM: TaskName = "causal-lm"
TASK_TOKENS: TaskName = "token-classification"
# What each task's validation reports: the metrics early_stopping.monitor may name.
TASK_METRICS = {
    TASK_CLASSIFY: ("val_loss", "val_acc", "val_f1", "train_loss"),
    TASK_CAUSAL_LM: ("val_loss", "val_perplexity", "train_loss"),
    TASK_TOKENS: ("val_loss", "val_f1", "val_precision", "val_recall", "train_loss"),
}
# Macro F1 over two classes says little beside accuracy: a classifier logs val_f1 only above this.
F1_MIN_LABELS = 3


def logged_metrics(task: str, num_labels: Optional[int]) -> tuple[str, ...]:
    """The metrics a job of `task` with `num_labels` labels actually logs (None: not known yet, so
    every metric the task can log). The runner logs by this and the pre-flight checks by it."""
    metrics = TASK_METRICS[task]  # type: ignore[index]
    if task == TASK_CLASSIFY and num_labels is not None and num_labels < F1_MIN_LABELS:
        metrics = tuple(m for m in metrics if m != "val_f1")
    return metrics


def metric_problem(metric: str, task: str, num_labels: Optional[int]) -> Optional[str]:
    """A metric this task (with this many labels) never logs: the sentence saying so."""
    logged = logged_metrics(task, num_labels)
    if metric in logged:
        return None
    if metric in TASK_METRICS[task]:  # type: ignore[index]
        return (
            f"{metric!r} is logged only with {F1_MIN_LABELS} or more labels and this job has {num_labels}; "
            f"use one of {', '.join(logged)}"
        )
    return f"{metric!r} is not a metric of model.task = {task!r} (use one of {', '.join(logged)})"


class ModelSection(JobTable):
    name_or_path: str = Field(min_length=1)
    task: TaskName = TASK_CLASSIFY
    num_labels: int = Field(default=2, ge=1)
    gradient_checkpointing: bool = False


class DataSection(JobTable):
    train: str = Field(min_length=1)
    validation: Optional[str] = None
    text_field: str = "text"
    text_pair_field: Optional[str] = None
    label_field: str = "label"
    max_length: int = Field(default=128, gt=0, le=100_000)
    num_workers: Optional[int] = Field(default=None, ge=0)  # None: min(4, cpu count)
    shuffle: bool = True
    # causal-lm: text_field (plain language modelling), or prompt_field + response_field (loss on
    # the response only), or messages_field (chat turns, loss on the assistant's turns).
    prompt_field: Optional[str] = Field(default=None, min_length=1)
    response_field: Optional[str] = Field(default=None, min_length=1)
    messages_field: Optional[str] = Field(default=None, min_length=1)
    packing: bool = False  # causal-lm: several short examples per row, attention within each
    # token-classification: a list of words and a list of tags (one per word) per row
    tokens_field: str = "tokens"
    tags_field: str = "tags"

    def task_fields(self, task: str) -> list[str]:
        """The data fields `task` reads (the ones orch submit looks for in the data file)."""
        if task == TASK_CAUSAL_LM:
            if self.messages_field:
                return ["messages_field"]
            return ["prompt_field", "response_field"] if self.prompt_field else ["text_field"]
        if task == TASK_TOKENS:
            return ["tokens_field", "tags_field"]
        return ["text_field", "text_pair_field", "label_field"]


class LoraSection(JobTable):
    """[lora] (causal-lm): train low-rank adapters through peft instead of every weight."""

    r: int = Field(default=8, gt=0, le=4096)
    alpha: float = Field(default=16.0, gt=0)
    dropout: float = Field(default=0.05, ge=0, lt=1)
    # None: peft's default for the architecture (e.g. q_proj, v_proj for Llama); "all-linear": every
    # linear layer but the output head; or the module names.
    target_modules: Union[Literal["all-linear"], list[str], None] = None
    merge: bool = False  # also export the base model with the adapter merged in (model/merged/)

    @field_validator("target_modules", mode="before")
    @classmethod
    def _modules_listed(cls, value: Any) -> Any:
        # One sentence, not the union's two ("must be 'all-linear'" and "must be a list").
        if isinstance(value, str) and value != "all-linear":
            raise ValueError(
                f'write the module names as a list, e.g. ["{value}"], or "all-linear" for every linear layer '
                f"(got {value!r})"
            )
        if isinstance(value, list) and not value:
            raise ValueError(
                'an empty list adapts nothing; name the modules (e.g. ["q_proj", "v_proj"]), write "all-linear", '
                "or leave target_modules out for peft's default"
            )
        return value


class TrainSection(JobTable):
    max_epochs: Optional[int] = Field(default=3, gt=0)
    max_steps: Optional[int] = Field(default=None, gt=0)
    batch_size: int = Field(default=32, gt=0)
    accumulate_grad_batches: int = Field(default=1, gt=0)
    precision: Literal["32", "16-mixed", "bf16-mixed"] = "16-mixed"
    learning_rate: float = Field(default=2e-5, gt=0)
    weight_decay: float = Field(default=0.01, ge=0)
    warmup_ratio: float = Field(default=0.1, ge=0, le=1)
    seed: int = Field(default=42, ge=INT64_MIN, le=INT64_MAX)
    val_check_interval: Union[int, float] = 1.0
    gradient_clip_val: Optional[float] = Field(default=1.0, ge=0)
    deterministic: bool = False
    # Training health: a `loss_flat` event when the loss fell by less than this fraction of its
    # first steps' mean after that many steps (None: not watched). The job goes on.
    flat_after_steps: Optional[int] = Field(default=None, gt=0)
    flat_min_improvement: float = Field(default=0.02, ge=0, lt=1)
    # Hang watchdog: no new step for this long -> stacks dumped, SIGTERM, grace, SIGKILL, retry (None: off).
    hang_minutes: Optional[float] = Field(default=None, gt=0, le=10080)
    # How the ranks of a multi-process job share the model: "ddp" (each rank a whole copy) or
    # "fsdp" (FSDP2: each rank a shard of the parameters, gradients and optimizer state, and
    # sharded checkpoints, one folder each). One process ignores it.
    strategy: Literal["ddp", "fsdp"] = "ddp"
    # fsdp only: the parameter shards and optimizer state live in host memory between uses.
    cpu_offload: bool = False

    @model_validator(mode="before")
    @classmethod
    def _max_steps_alone(cls, data: Any) -> Any:
        # max_steps given without max_epochs: the steps end training, not the default 3 epochs
        if isinstance(data, dict) and data.get("max_steps") is not None and "max_epochs" not in data:
            return {**data, "max_epochs": None}
        return data

    @model_validator(mode="after")
    def _check_interval(self) -> "TrainSection":
        v = self.val_check_interval
        if isinstance(v, float) and not (0 < v <= 1):
            raise ValueError(
                f"val_check_interval: a fraction of an epoch must be in (0, 1], or give a whole number of batches (got {v})"
            )
        if isinstance(v, int) and v < 1:
            raise ValueError(f"val_check_interval: must be at least 1 batch (got {v})")
        return self

    @field_validator("cpu_offload")
    @classmethod
    def _offload_needs_fsdp(cls, value: bool, info: ValidationInfo) -> bool:
        # a field check (strategy is validated before it), so the line names train.cpu_offload
        if value and info.data.get("strategy", "fsdp") != "fsdp":
            raise ValueError(
                f'offloads FSDP shards; it needs strategy = "fsdp" (strategy is {info.data["strategy"]!r})'
            )
        return value


class EarlyStoppingSection(JobTable):
    monitor: Literal["val_loss", "val_acc", "val_f1", "val_precision", "val_recall", "val_perplexity", "train_loss"] = (
        "val_loss"
    )
    mode: Optional[Literal["min", "max"]] = None  # None: min for a loss, max otherwise
    patience: int = Field(default=3, ge=0)
    min_delta: float = Field(default=0.0, ge=0)

    @property
    def resolved_mode(self) -> str:
        return self.mode or ("min" if self.monitor.endswith("loss") else "max")


class CheckpointSection(JobTable):
    every_n_steps: Optional[int] = Field(default=None, gt=0)
    every_minutes: Optional[float] = Field(default=10.0, gt=0)
    keep: int = Field(default=3, ge=1)
    # Periodic checkpoints: the step blocks only for a snapshot of the state; a background thread
    # writes it (training/resume/snapshot.py). false: written inside the step, as notice checkpoints are.
    background: bool = True
    # "auto": the interval is sqrt(2 x the measured save blocking time x the MTBF) (Young/Daly),
    # re-chosen after every save; every_minutes is then only the first interval.
    every: Optional[Literal["auto"]] = None
    mtbf_hours: Optional[float] = Field(default=None, gt=0)  # for "auto": else the machine's, else 6 h


class BudgetSection(JobTable):
    max_cost: Optional[float] = Field(default=None, gt=0)
    max_hours: Optional[float] = Field(default=None, gt=0)


class SlurmJobSection(JobTable):
    """[slurm] in job.toml: this job's own partition, walltime and extra sbatch flags (Slurm executor)."""

    partition: Optional[str] = Field(default=None, min_length=1)
    time: Optional[str] = Field(default=None, min_length=1)
    extra_args: list[str] = []

    @model_validator(mode="after")
    def _one_line_each(self) -> "SlurmJobSection":
        # Each value becomes an `#SBATCH` line: a newline would end it and start a shell line.
        for field, value in (
            ("partition", self.partition),
            ("time", self.time),
            *((f"extra_args[{i}]", a) for i, a in enumerate(self.extra_args)),
        ):
            problem = control_problem(value, allow_tab=False) if value is not None else None
            if problem:
                raise ValueError(f"{field}: {problem} (got {value!r})")
        return self


TrackerName = Literal["wandb", "swanlab", "mlflow"]


class TrackingSection(JobTable):
    """[tracking]: experiment trackers the built-in runner logs to, one run per job (docs/tracking.md).
    A command job gets the trackers' own variables (run ids, project, mode) whatever it logs with."""

    backends: list[TrackerName] = Field(min_length=1)
    project: Optional[str] = Field(default=None, min_length=1, max_length=128)  # default: the job's name
    mode: Literal["online", "offline"] = "online"
    mlflow_uri: Optional[str] = Field(default=None, min_length=1, max_length=2000)  # default: MLFLOW_TRACKING_URI

    @model_validator(mode="after")
    def _consistent(self) -> "TrackingSection":
        twice = sorted({b for b in self.backends if self.backends.count(b) > 1})
        if twice:
            raise ValueError(f"backends: {twice[0]!r} is listed twice")
        if self.project is not None:
            bad = sorted(set(self.project) & set("/\\#?%:"))
            if bad or control_problem(self.project):
                raise ValueError(
                    f"project: {self.project[:60]!r} cannot be a tracker project name "
                    "(no / \\ # ? % : or control characters)"
                )
        if self.mlflow_uri is not None:
            if "mlflow" not in self.backends:
                raise ValueError('mlflow_uri: set, but "mlflow" is not in backends; add it or remove mlflow_uri')
            if control_problem(self.mlflow_uri, allow_tab=False):  # it may hold a password: never echoed
                raise ValueError(f"mlflow_uri: {control_problem(self.mlflow_uri, allow_tab=False)}")
        return self
