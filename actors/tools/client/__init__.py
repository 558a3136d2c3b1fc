"""The daemon side of the tool wire: a port per tool host, its connection and its calls."""
