"""`python -m depsnap ...` (the same as `bootseer depsnap ...`)."""

import sys

from depsnap.cli import main

sys.exit(main())
