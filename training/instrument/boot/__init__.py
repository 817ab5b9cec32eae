"""The folder orch puts first on an instrumented job's PYTHONPATH: its sitecustomize.py is the bootstrap."""
