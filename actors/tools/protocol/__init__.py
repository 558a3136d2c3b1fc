"""What the session side and a tool host share: the wire, the specs, the provider contract.

Imported by both processes, so it imports no pykka, no records, nothing of the session.
"""
