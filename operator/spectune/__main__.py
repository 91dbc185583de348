"""``python -m spectune``: the same command as ``spectune`` (:func:`spectune.cli.main`)."""

import sys

from spectune.cli import main

sys.exit(main())
