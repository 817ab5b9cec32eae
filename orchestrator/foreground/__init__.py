"""`orch run`: a job recorded like a submit, then run here, in the foreground, by this process as
its supervisor (supervisor.py; the job recorded and claimed: record.py; the signals it hears:
signals.py). It starts, decides and finishes attempts through the daemon's own functions
(jobs/attempts.py, jobs/settling.py, planning/dispatch.py, jobs/budget_stop.py); the CLI verb only
parses its arguments and prints what this room says."""
