"""`python -m ibpool_dashboard`; config from env (`IBPOOL_DASHBOARD_*`) or TOML."""

from __future__ import annotations

import sys

from .service import main

if __name__ == "__main__":
    sys.exit(main())
