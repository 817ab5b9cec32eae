"""`orch watch`'s process: the recovery controller's loop in the foreground (loop.py), beside the
daemon's. The CLI parses the command and prints what the loop says; the decisions are recovery/'s."""
