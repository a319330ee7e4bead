"""``python -m sqlalchemy_tickets``: the same as the ``sqlalchemy-tickets`` command."""

from .cli import main

raise SystemExit(main())
