"""`python -m mercury` is the `mercury` console script."""

import sys

from mercury.cli import main

sys.exit(main())
