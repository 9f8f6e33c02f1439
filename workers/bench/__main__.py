"""`python -m workers.bench ...`: the job process (`workers.bench.run.main`).

Only the call lives here: this file runs as `__main__`, and whatever it defined would exist a
second time were anything to import it as `workers.bench.__main__`.
"""

import sys

from workers.bench.run import main

sys.exit(main())
