"""`python -m partir_plugin.cli`: the `partir` command."""

import sys

from .main import main

sys.exit(main())
