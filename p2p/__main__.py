"""`python -m p2p ...` is the `bootseer` command."""

import sys

from p2p.cli import main

sys.exit(main())
