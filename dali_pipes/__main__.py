"""`python -m dali_pipes ...` is the `dali-pipes` command."""

import sys

from dali_pipes.tools.cli import main

sys.exit(main())
