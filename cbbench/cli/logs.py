"""The handler that prints the library's notices: the `cbbench` logger's records, one line each
on stderr as `cbbench: <message>` (library code logs; only the CLI decides where it goes).

stderr is looked up per record (typer.echo), not bound once: a test's CliRunner swaps it."""

from __future__ import annotations

import logging

import typer

LOGGER = "cbbench"


class NoticeHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            typer.echo(f"cbbench: {record.getMessage()}", err=True)
        except Exception:  # a closed stderr must not end a run that is measuring
            self.handleError(record)


def install() -> None:
    """Idempotent: the app module is imported once per process, tests import it again."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(h, NoticeHandler) for h in logger.handlers):
        logger.addHandler(NoticeHandler())
    logger.setLevel(logging.INFO)
    logger.propagate = False  # printed once, here; not again by a root handler
