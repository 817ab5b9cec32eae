import sys

from .deps import missing

gone = missing()
if gone:
    print(f"gpu-check: cannot import: {'; '.join(gone)}", file=sys.stderr)
    print(
        "gpu-check: on a machine with network run 'bash scripts/fetch-wheels.sh' and bring wheels/ along",
        file=sys.stderr,
    )
    sys.exit(2)

from .check import main  # noqa: E402  (it imports pydantic, checked above)

sys.exit(main())
