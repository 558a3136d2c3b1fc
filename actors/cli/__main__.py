"""``python -m actors.cli``: the ``loopd`` command (see :mod:`actors.cli.main`)."""

import sys

from actors.cli.main import main

sys.exit(main())
