"""The Slurm executor: one `sbatch` per attempt (executor.py), Slurm's answers cached off the tick's
lock (watch.py, submit.py, commands.py, query.py), the batch script (script.py) and the step that
runs on the nodes (step.py). Reached only through orchestrator.executors (model/executor_kinds.py
names the class)."""
