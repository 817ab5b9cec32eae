"""This machine: process identity, GPUs, where a job's code came from, polling helpers."""
