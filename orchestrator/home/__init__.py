"""$ORCH_HOME: where state lives, the one-daemon lock, drain and the wake nudge."""
