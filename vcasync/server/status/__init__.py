"""The coordinator's live status page: one HTML page with its own script and style (no build step,
no CDN, works offline) that polls ``/status/data`` and shows the run's progress, units by state,
workers, merge rate, staleness, recent events and the evaluation curve. See docs/status-page.md.
"""

from .access import StatusAccess, is_local_host, is_loopback
from .routes import ASSETS, PUBLIC_STATUS_ROUTES, STATUS_ACCESS, page_data, routes

__all__ = ["ASSETS", "PUBLIC_STATUS_ROUTES", "STATUS_ACCESS", "StatusAccess", "is_local_host", "is_loopback",
           "page_data", "routes"]
