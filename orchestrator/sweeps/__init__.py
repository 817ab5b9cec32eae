"""Sweeps: many trials of one base job, proposed and pruned by Optuna, each trial an ordinary job.
`spec` reads the [sweep] file, `study` is the one place that imports optuna (lazily),
`controller` is the daemon's sweep step, `summary` what `orch sweep show` and the dashboard print."""
