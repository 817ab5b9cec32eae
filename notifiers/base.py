"""The notification vocabulary shared by every channel: the Message a job event becomes, the
Notifier protocol the daemon calls, and the two errors (a delivery failure, a bad config)."""

from __future__ import annotations

import html as html_lib
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, Protocol, runtime_checkable

from orchestrator.cost.money import format_duration
from orchestrator.model.errors import ConfigError, OrchError
from orchestrator.model.states import DEFAULT_NOTIFY_EVENTS, SUBSCRIBABLE

from orchestrator.redaction import redact

# The event kinds a notifier may subscribe to, and its default: the daemon's vocabulary, one source.
EVENT_KINDS = SUBSCRIBABLE
DEFAULT_EVENTS = DEFAULT_NOTIFY_EVENTS

# How each event reads after "job 7 sst2-bert ..." (or after "orch on HOST ..." without a job).
_HEADLINE = {
    "submitted": "was submitted",
    "started": "started",
    "succeeded": "succeeded",
    "failed": "failed",
    "retrying": "failed; retrying",
    "preempted": "was preempted",
    "resumed": "resumed from a checkpoint",
    "oom": "ran out of GPU memory",
    "stopped": "was stopped",
    "lease_lost": "was taken over by another machine (its mirror lease): it runs there now",
    "adopted": "was adopted from another machine's mirror",
    "pruned": "was pruned by its sweep",
    "cancelled": "was cancelled",
    "notice": "got a preemption notice",
    "queue_drained": "has nothing left to run",
    "idle_shutdown": "is idle and powering the machine off",
    "diverged": "diverged: its loss became NaN or infinite",
    "loss_flat": "has a flat training loss",
    "deadline_at_risk": "will miss its deadline",
    "deadline_recovered": "is on time for its deadline again",
    "env_changed": "runs in a changed environment",
    "test": "says hello: notifications work",  # `orch notify test`; not a subscribable event
}

# What a tired researcher should do next, per event ({id} is the job id).
_NEXT_STEP = {
    "failed": "See `orch logs {id}`; `orch retry {id}` resumes from the latest checkpoint.",
    "stopped": "The reason says why; `orch retry {id}` (with `--budget AMOUNT` after a budget stop) continues it "
    "from its latest checkpoint.",
    "lease_lost": "Nothing to do here: it goes on where it was adopted (the reason names the machine). "
    "Do not retry it here: that would train it twice.",
    "adopted": "Nothing to do: it resumes here from its mirrored checkpoint.",
    "env_changed": "The message lists what changed since its first attempt; `orch show {id}` shows its "
    "provenance. A change of torch, CUDA or the training libraries breaks bit-exact resume.",
    "retrying": "Nothing to do yet: it resumes from its latest checkpoint. `orch logs {id}` shows why.",
    "preempted": "Nothing to do: it resumes from its latest checkpoint when the daemon runs again.",
    "oom": "Nothing to do: it runs again with half the micro-batch and twice the accumulation.",
    "diverged": "Lower [train] learning_rate (or set gradient_clip_val) and submit it again; the checkpoints "
    "from before the divergence stay in its run folder.",
    "loss_flat": "It goes on training. Look at its curve (`orch dashboard`); `orch cancel {id}` if it will not learn.",
    "deadline_at_risk": "It goes on. The reason says what would help: a higher priority or fewer epochs.",
}

_LOG_TAIL_LINES = 30
_LOG_TAIL_CHARS = 3000


@dataclass
class Message:
    """One notification: everything a channel may show about one event of one job."""

    event: str
    job_id: int | None = None
    job_name: str = ""
    state: str = ""
    reason: str = ""
    attempt: int | None = None
    duration_s: float | None = None
    cost: float | None = None
    currency: str = ""
    best_metric: str = ""  # e.g. "val_acc=0.931"
    checkpoint: str = ""
    host: str = ""
    log_tail: str = ""
    steps_lost: int | None = None
    gpu_hours: float | None = None
    waste_s: float | None = None
    waste_cost: float | None = None
    # The run's metric series ({metric: [[step, value], ...]}, from its metrics.csv), set by the
    # outbox on end-of-job messages: channels that can show a picture attach its loss curve
    # (curve_png); the others ignore it.
    curve_series: dict[str, list[list[Any]]] = field(default_factory=dict)

    def curve_png(self) -> bytes | None:
        """The loss curve as a small PNG, or None (no series, no loss column)."""
        if not self.curve_series:
            return None
        from .curve import draw_curves

        try:
            return draw_curves(self.curve_series)
        except ValueError:
            return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        # Keys from a newer orch (stored in the outbox before a downgrade) are dropped, not fatal.
        known = {f.name for f in dataclass_fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    # ---- rendering -------------------------------------------------------------------

    def title(self) -> str:
        headline = _HEADLINE.get(self.event, self.event.replace("_", " "))
        if self.job_id is not None:
            subject = f"job {self.job_id} {self.job_name}".rstrip()
        elif self.job_name:  # a job seen in the mirror (`orch watch`): no local id, its name says which
            subject = f"job {self.job_name}"
        else:
            subject = f"orch on {self.host}" if self.host else "orch"
        return f"[orch] {subject} {headline}"

    def fields(self) -> list[tuple[str, str]]:
        """(label, value) pairs worth showing, in reading order; empty values are left out."""
        rows: list[tuple[str, str]] = []
        if self.job_id is not None:
            rows.append(("Job", f"{self.job_id} ({self.job_name})" if self.job_name else str(self.job_id)))
        elif self.job_name:
            rows.append(("Job", self.job_name))
        rows += [("Event", self.event), ("State", self.state), ("Reason", self.reason)]
        if self.attempt is not None:
            rows.append(("Attempt", str(self.attempt)))
        if self.duration_s is not None:
            rows.append(("Duration", format_duration(self.duration_s)))
        if self.cost is not None:
            rows.append(("Cost", f"{self.cost:.2f} {self.currency}".rstrip()))
        if self.gpu_hours:
            rows.append(("GPU-hours", f"{self.gpu_hours:.2f}"))
        rows += [("Best metric", self.best_metric), ("Checkpoint", self.checkpoint)]
        if self.steps_lost:
            waste = f" ({format_duration(self.waste_s or 0)} recomputed"
            waste += f", {self.waste_cost:.2f} {self.currency}".rstrip() if self.waste_cost else ""
            rows.append(("Steps lost", f"{self.steps_lost}{waste})"))
        rows.append(("Host", self.host))
        return [(label, value) for label, value in rows if value]

    def next_step(self) -> str:
        template = _NEXT_STEP.get(self.event, "")
        return template.format(id=self.job_id) if template and self.job_id is not None else ""

    def log_lines(self) -> list[str]:
        # A training log can print tokens (HF_TOKEN=..., a webhook URL); mask them before they leave.
        tail = redact(self.log_tail.strip("\n"))[-_LOG_TAIL_CHARS:]
        return tail.splitlines()[-_LOG_TAIL_LINES:] if tail else []

    def text(self) -> str:
        lines = [self.title(), ""] + [f"{label}: {value}" for label, value in self.fields()]
        if self.next_step():
            lines += ["", self.next_step()]
        if self.log_lines():
            lines += ["", "Last log lines:"] + self.log_lines()
        return "\n".join(lines)

    def markdown(self, code_blocks: bool = True) -> str:
        """Markdown; code_blocks=False quotes the log tail instead (WeCom renders no fences)."""
        lines = [f"**{self.title()}**", ""] + [f"- **{label}:** {value}" for label, value in self.fields()]
        if self.next_step():
            lines += ["", self.next_step()]
        log = self.log_lines()
        if log:
            lines += ["", "**Last log lines:**"]
            lines += ["```", *log, "```"] if code_blocks else [f"> {line}" for line in log]
        return "\n".join(lines)

    def html(self) -> str:
        esc = html_lib.escape
        rows = "".join(
            f"<tr><th align='left'>{esc(label)}</th><td>{esc(value)}</td></tr>" for label, value in self.fields()
        )
        parts = [f"<h3>{esc(self.title())}</h3>", f"<table>{rows}</table>"]
        if self.next_step():
            parts.append(f"<p>{esc(self.next_step())}</p>")
        if self.log_lines():
            parts.append("<p><b>Last log lines:</b></p><pre>" + esc("\n".join(self.log_lines())) + "</pre>")
        return "<html><body>" + "".join(parts) + "</body></html>"


def truncate_utf8(text: str, max_bytes: int, marker: str = "\n…(truncated)") -> str:
    """Cut text so its UTF-8 encoding fits max_bytes, never splitting a character."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    room = max_bytes - len(marker.encode("utf-8"))
    if room <= 0:  # no space even for the marker
        return data[:max_bytes].decode("utf-8", errors="ignore")
    return data[:room].decode("utf-8", errors="ignore") + marker


class NotifyError(OrchError):
    """A message was not delivered. `retryable` says whether trying again later can help;
    `code` is the provider's own code (or the HTTP status, or "timeout"/"connection")."""

    def __init__(
        self,
        channel: str,
        provider_message: str,
        *,
        retryable: bool,
        code: int | str | None = None,
        retry_after: float | None = None,
    ):
        self.channel = channel
        self.provider_message = redact(provider_message)
        self.retryable = retryable
        self.code = code
        self.retry_after = retry_after
        super().__init__(str(self))

    @property
    def summary(self) -> str:
        """The provider's words and code, without the channel name (for a per-channel record)."""
        code = f" (code {self.code})" if self.code is not None else ""
        return f"{self.provider_message}{code}"

    def __str__(self) -> str:
        kind = "will retry" if self.retryable else "permanent; check the notifier's config"
        return f"{self.channel}: {self.summary} [{kind}]"

    def __repr__(self) -> str:
        return (
            f"NotifyError(channel={self.channel!r}, code={self.code!r}, retryable={self.retryable}, "
            f"provider_message={self.provider_message!r}, retry_after={self.retry_after!r})"
        )


class NotifierConfigError(ConfigError):
    """The [[notifiers]] tables are invalid; `problems` has one line per problem."""


@runtime_checkable
class Notifier(Protocol):
    name: str
    events: frozenset[str]
    min_interval_s: float

    @property
    def type(self) -> str: ...  # a class attribute on the channels

    def send(self, message: Message) -> None: ...

    def describe(self) -> str: ...
