"""``python -m actors.tools.host``: run a tool host (see :mod:`actors.tools.host.main`)."""

import sys

from actors.tools.host.main import main

sys.exit(main(sys.argv[1:]))
