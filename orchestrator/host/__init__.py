"""This machine and the environment a job runs in: process identity, GPUs, the interpreter a job
starts, its installed distributions and the system around it (recorded and compared across
attempts), where a job's code came from, polling helpers."""
