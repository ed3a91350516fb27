"""``python -m runner.cli``: the same as the ``flowrun`` console script."""

import sys

from runner.cli.main import main

sys.exit(main())
