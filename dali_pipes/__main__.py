"""`python -m dali_pipes ...` is the `dali-pipes` command."""

import sys

from dali_pipes.cli import main

sys.exit(main())
