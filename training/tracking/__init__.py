"""Experiment trackers (W&B, MLflow, SwanLab): the worker threads, one backend per library, and
tracking.json, the notes `orch show` prints."""
