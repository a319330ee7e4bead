"""Without greenlet (SQLAlchemy 2.1 no longer installs it), everything synchronous still works.

Each check runs in a fresh interpreter where ``import greenlet`` fails, as after a plain
``pip install sqlalchemy-tickets``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

_BLOCK_GREENLET = "import sys; sys.modules['greenlet'] = None\n"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK_GREENLET + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_block_really_hides_greenlet() -> None:
    # SQLAlchemy 2.0 imports sqlalchemy.ext.asyncio without greenlet; greenlet itself must fail.
    done = _run("import greenlet")
    assert done.returncode != 0
    assert "greenlet" in done.stderr


def test_import_flush_and_retry_session_without_greenlet() -> None:
    done = _run(
        """
        import sqlalchemy as sa
        from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
        import sqlalchemy_tickets
        from sqlalchemy_tickets import TicketId, apply_timeouts, retry_session

        class Base(DeclarativeBase):
            pass

        class Photo(Base):
            __tablename__ = "photos"
            id: Mapped[int] = mapped_column(TicketId(), primary_key=True)

        engine = apply_timeouts(sa.create_engine("sqlite://"), 5)
        Base.metadata.create_all(engine)

        retry_session(sessionmaker(engine), lambda session: session.add(Photo()))
        with sessionmaker(engine)() as session:
            photo = Photo()
            session.add(photo)
            session.commit()
            ids = session.scalars(sa.select(Photo.id).order_by(Photo.id)).all()
        assert ids == [1, 2], ids
        print("ok", ids)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")
