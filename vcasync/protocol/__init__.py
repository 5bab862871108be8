"""The protocol room: what the coordinator's HTTP server and its client agree on.

Both ends import it and nothing here speaks HTTP itself: ``_messages`` holds the routes, media types
and control-message bodies; ``_errors`` the one table from the exception tree to HTTP statuses and
codes (the server answers with it, the client re-raises with it).
"""
