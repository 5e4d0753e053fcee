"""`python -m taskd ...` is the `taskd` command."""

import sys

from taskd.cli import main

sys.exit(main())
