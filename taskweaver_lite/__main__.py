"""`python -m taskweaver_lite` is the same program as `taskweaver-lite`."""

import sys

from taskweaver_lite.cli.main import main

sys.exit(main())
