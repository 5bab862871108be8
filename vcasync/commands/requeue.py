"""``vcasync requeue``: queue a running coordinator's parked units again, without restarting it.

A unit is parked after it failed on several distinct workers; once whatever broke it is fixed (a bad
shard, a trainer bug, a broken node pool), the operator queues it again. The call needs the
coordinator's **operator token**, never the join secret (every volunteer holds that): from
``VCASYNC_OPERATOR_TOKEN`` or ``--operator-token-file``, never a flag value.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from ..cli import Command, ExitCode, read_secret
from ..errors import AuthError, ConfigError, LedgerError

log = logging.getLogger("vcasync.cli")


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--coordinator", required=True,
                   help="the coordinator's URL, http(s)://host:port (a path if a proxy mounts it under one)")
    p.add_argument("--unit", action="append", default=[], metavar="UNIT_ID", dest="units",
                   help="a parked unit to requeue (repeatable); none: every parked unit")
    p.add_argument("--operator-token-file", type=Path,
                   help="file holding the operator token (or VCASYNC_OPERATOR_TOKEN)")
    p.add_argument("--ca-file", type=Path, help="CA certificate to verify an https coordinator")


def _run(a: argparse.Namespace) -> int:
    import asyncio

    from .._paths import check_ca_file
    from ..worker._client import (
        CoordinatorClient,
        check_coordinator_url,
        check_requeue_units,
        client_ssl_context,
        plain_http_hint,
        tls_problem,
    )

    check_coordinator_url(a.coordinator)     # a typo is a configuration error, not "cannot reach"
    note = check_ca_file(a.ca_file, str(a.coordinator))
    if note is not None:
        log.warning("%s", note)
    token = read_secret("VCASYNC_OPERATOR_TOKEN", a.operator_token_file, what="operator token")
    if not token:
        raise ConfigError("no operator token: set VCASYNC_OPERATOR_TOKEN or --operator-token-file "
                          "(the coordinator must be started with the same one)")
    check_requeue_units(a.units or None)
    url = str(a.coordinator).rstrip("/")
    ssl_ctx = client_ssl_context(a.ca_file) if url.startswith("https://") else None

    async def main() -> list[str]:
        async with CoordinatorClient(url, ssl_context=ssl_ctx) as client:
            return await client.requeue(token, a.units or None)

    import sys

    import aiohttp

    try:
        done = asyncio.run(main())
    except LedgerError as exc:
        # a unit that is not parked, or no unit of the run (a typo): the operator's to fix, as an
        # empty --unit is (exit 2); exit 1 reads as "restart, the run resumes", and no retry mends it
        detail = str(exc).removesuffix("; nothing was requeued")
        raise ConfigError(f"the coordinator at {url} refused it: {detail}; nothing was requeued "
                          "(only parked units can be requeued: GET /v1/status lists them under "
                          "'parked', and vcasync requeue without --unit requeues every one)") from None
    except AuthError as exc:
        # a wrong token is configuration (exit 2, as the worker's refused join credential), not
        # an error a retry could mend (exit 1)
        raise ConfigError(f"the coordinator at {url} refused the operator token ({exc}): set "
                          "VCASYNC_OPERATOR_TOKEN or --operator-token-file to the one it was started "
                          "with; nothing was requeued") from None
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        problem = tls_problem(exc, url, a.ca_file)
        if problem is not None:   # the coordinator is running and the URL is right: not "reach"
            raise ConfigError(f"{problem}; nothing was requeued") from None
        # a traceback here told the operator nothing they could act on
        detail = str(exc) or type(exc).__name__
        print(f"vcasync requeue: cannot reach the coordinator at {url}: {detail} (nothing was "
              f"requeued; is it running, and is the URL its listening address?"
              f"{plain_http_hint(exc, url)})", file=sys.stderr)
        return ExitCode.ERROR
    print(json.dumps({"requeued": done}))
    log.info("requeued %d unit(s)", len(done))
    return ExitCode.OK


COMMAND = Command(name="requeue", help="queue a running coordinator's parked units again (operator)",
                  configure=_configure, run=_run)
