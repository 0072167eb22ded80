"""`python -m homegpu.trainer`: see train.py."""

import sys

from homegpu.trainer.train import main

sys.exit(main())
