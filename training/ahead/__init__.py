"""What is checked or measured before a job runs: the pre-flight `orch submit` asks for (a data file's
first rows, their checks) and the probe behind `orch estimate`."""
