"""The daemon process: the tick and its steps (tick.py), the runtime loop that drives them
(runtime.py), cost accrual, the notification outbox (delivered by jobs/outbox.py), user hooks and preemption sources. The CLI
never imports this package, except `orch daemon run`, which becomes the daemon."""
