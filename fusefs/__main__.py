"""`python -m fusefs mount TREE_FILE DIR ...` (the same as `bootseer fs mount`)."""

import sys

from fusefs.cli import main

sys.exit(main())
