"""`python -m training.preflight < REQUEST.json`: what `orch submit` asks of a built-in job before it is
queued. The door only: the body is training/ahead/preflight.py. `--serve SOCKET --owner PID`: the
same kept warm beside the daemon (training/ahead/serve.py)."""

from __future__ import annotations

import sys

from training.ahead.preflight import main

__all__ = ["main"]


if __name__ == "__main__":
    if "--serve" in sys.argv:
        from training.ahead.serve import serve_main

        sys.exit(serve_main(sys.argv))
    sys.exit(main())
