"""The machine a job runs on: what its environment holds (the interpreter a job starts, its
installed distributions, the system around it), recorded and compared across attempts."""
