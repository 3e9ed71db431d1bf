"""``python -m aiqsim`` is the ``aiqsim`` command."""

from aiqsim.cli import main

raise SystemExit(main())
