"""`python -m dali_pipes.doctor`: how a user checks a GPU machine (tools/doctor.py does the work)."""

import sys

from dali_pipes.tools.doctor import main

if __name__ == "__main__":
    sys.exit(main())
