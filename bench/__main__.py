"""`python -m bench [--quick] [--only SECTIONS]`: every performance figure in one run (see bench.run_all)."""

import sys

from bench.run_all import main

sys.exit(main())
