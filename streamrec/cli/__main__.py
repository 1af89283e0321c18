"""``python -m streamrec.cli ARGS``: the ``streamrec`` command."""

import sys

from streamrec.cli.main import main

sys.exit(main())
