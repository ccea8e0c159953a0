"""`python -m rlcaption`: the `rlcaption` command."""

import sys

from .cli import main

sys.exit(main())
