"""`python -m mercury.dev` (what `make run` runs): the local deployment."""

import sys

from mercury.dev.run import main

sys.exit(main())
