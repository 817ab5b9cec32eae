"""Exact resume: checkpoint files (atomic writes, names, retention), the background snapshot and the
memory it may hold, the automatic checkpoint interval, OOM batch resizing, the loader position and
RNG streams a resume restores, the sampler whose state counts samples."""
