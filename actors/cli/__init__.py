"""The person's command, ``loopd`` (:mod:`actors.cli.main`): every command, the daemon and
``loopd acp`` start here."""

from actors.base import startup as _startup  # noqa: F401  first: before anything imports httpx
