"""`python -m homegpu.trainer`: see cli.py for the options and PROTOCOL.md for its output."""

import sys

from homegpu.trainer.cli import main

sys.exit(main())
