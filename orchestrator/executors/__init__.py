"""How attempts run: the interface the daemon's tick uses (base.py) and its implementations
(local.py: a supervisor process per attempt on this machine)."""
