"""``loopd serve``: the daemon's side of the client protocol (see ``protocol.py``)."""
