"""`python -m fusefs.image ...` (the same as `bootseer image ...`)."""

import sys

from fusefs.image.cli import main

sys.exit(main())
