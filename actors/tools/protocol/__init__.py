"""What the session side and a tool host share: the wire, the specs (the standard tools'
too), the provider contract, and the workspace walk (the file tools walk by it; the
session's small-model aids read the same files by the same rule).

Imported by both processes, so it imports no pykka, no records, nothing of the session.
"""
