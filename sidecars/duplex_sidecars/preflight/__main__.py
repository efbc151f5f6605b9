"""`python -m duplex_sidecars.preflight`: the same as `duplex preflight`, for images without the `duplex` command."""

import sys

from duplex_sidecars.preflight.cli import main

sys.exit(main())
