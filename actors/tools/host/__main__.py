"""``python -m actors.tools.host``: run a tool host (see :mod:`actors.tools.host.main`)."""

import sys

from actors.base import startup
from actors.tools.host.main import main

startup.program()
sys.exit(main(sys.argv[1:]))
