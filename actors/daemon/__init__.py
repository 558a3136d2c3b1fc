"""What a client of ``loopd serve`` runs: the protocol (``protocol.py``), where the daemon
is (``address.py``) and the Python client (``client.py``). The daemon itself, ``loopd
serve``, is ``server/``; a client never imports it (tests/test_layers.py)."""
