"""How long the mirror waits on a store before calling it stalled: one definition, for the client's
timeouts (remote.py) and for `orch status`'s "mirror lagging" (views/mirror.py)."""

# A store that takes bytes but never answers (a frozen endpoint, a dead NAT) must fail like one that
# refuses: no read from it for READ_TIMEOUT_S ends a request, and retries stop after RETRY_WINDOW_S,
# so a stall surfaces as a StorageError in about STALL_S. `orch status` calls a checkpoint waiting
# longer than STALL_S for its upload a lagging mirror (views/mirror.py).
READ_TIMEOUT_S = 10.0
RETRY_WINDOW_S = 10.0
STALL_S = 20.0
# Whole-request bound: one part (part_size) at no less than this rate, never under a minute.
MIN_UPLOAD_BYTES_PER_S = 128 * 1024
