"""The session service: what a person's command does to sessions, wherever they run.

:mod:`actors.service.types` is the seam: one protocol
(:class:`~actors.service.types.SessionService`) and one set of frozen results, importable
by a daemon client without pykka. Two implementations: :mod:`actors.service.local` (in this
process, on a World; the daemon's server calls the same one) and
:mod:`actors.service.remote` (over the daemon's wire). :func:`actors.service.choose.choose`
picks one from the config and the command's flags.
"""
