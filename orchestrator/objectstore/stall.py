"""How long the mirror waits on a store before calling it stalled: one definition, for the client's
timeouts (remote.py) and for `orch status`'s "mirror lagging" (views/mirror.py)."""

# A store that takes bytes but never answers (a frozen endpoint, a dead NAT) must fail like one that
# refuses. Every request but an upload's gives up after READ_TIMEOUT_S without a byte from the store,
# and retries stop after RETRY_WINDOW_S, so such a store surfaces as a StorageError in about STALL_S.
# An upload reads nothing while it sends, so its client has no read timeout; the mirror probes the
# store while one runs (daemon/mirror/stall.py). `orch status` calls a checkpoint waiting longer
# than STALL_S for its upload a lagging mirror (views/mirror.py).
READ_TIMEOUT_S = 10.0
RETRY_WINDOW_S = 10.0
STALL_S = 20.0
# Whole-request bound, the backstop for a store that stops taking an upload's bytes mid-part (the
# read timeout only starts once the body is sent): ten minutes, or one part at 1 MiB/s when parts
# are bigger than that allows; never shorter, so a slow but working link is never cut off.
MIN_REQUEST_S = 600.0
MIN_UPLOAD_BYTES_PER_S = 1024 * 1024
