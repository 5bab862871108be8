"""Built-in merge policies, installed as ``vcasync.plugins``; registered by entry point."""
