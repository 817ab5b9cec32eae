"""The Ray executor: one Ray job per attempt through the head's Jobs REST API (executor.py, api.py;
nothing imports `ray`), every call to the head off the tick's lock (wire.py), Ray's answers cached
(watch.py), the step that runs on the node (step.py) and `orch doctor`'s checks (shared.py,
doctor.py). Reached only through orchestrator.executors (model/executor_kinds.py names them)."""
