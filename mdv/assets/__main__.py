"""``python -m mdv.assets list|fetch|check``: runs :func:`mdv.assets.main` (see :mod:`mdv.assets.cli`)."""
import sys

from mdv.assets import main

if __name__ == "__main__":
    sys.exit(main())
