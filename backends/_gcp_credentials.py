"""Where Google Cloud credentials would come from, found out locally and in about a second.

gcloud-aio-auth looks for credentials only when the first request needs a token, and when there are
none it ends up asking the metadata server (``metadata.google.internal``) with retries: off Google
Cloud that is ~50 seconds and then a "transient" error that says nothing about credentials. This
module follows the same order of application default credentials as google-auth, without the retries,
so a coordinator can say at start-up that no credentials were found and how to provide them:

1. ``GOOGLE_APPLICATION_CREDENTIALS`` (a file that must exist);
2. gcloud's user credentials, ``$CLOUDSDK_CONFIG`` or ``~/.config/gcloud`` (``%APPDATA%\\gcloud``),
   ``application_default_credentials.json``;
3. the metadata server of a Google Cloud machine: one request, ``timeout_s`` at most, to
   ``$GCE_METADATA_HOST`` (or ``$GCE_METADATA_ROOT``, else ``metadata.google.internal``), which
   must answer with the ``Metadata-Flavor: Google`` header.
"""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp

from vcasync.errors import AccessDeniedError

__all__ = ["HOW_TO_PROVIDE", "find_credentials"]

HOW_TO_PROVIDE = ("set GOOGLE_APPLICATION_CREDENTIALS to a service-account JSON file, pass the "
                  "service_file option, run `gcloud auth application-default login`, or run on "
                  "Google Cloud; for an emulator set emulator_host (or STORAGE_EMULATOR_HOST)")


def _gcloud_dir() -> Path:
    configured = os.environ.get("CLOUDSDK_CONFIG")
    if configured:
        return Path(configured)
    if os.name == "nt":
        return Path(os.environ.get("APPDATA", "C:\\")) / "gcloud"
    return Path.home() / ".config" / "gcloud"


def metadata_host() -> str:
    return (os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_ROOT")
            or "metadata.google.internal")


async def _metadata_server(timeout_s: float) -> str | None:
    host = metadata_host()
    url = f"http://{host}/computeMetadata/v1/"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session, \
                session.get(url, headers={"Metadata-Flavor": "Google"}) as resp:
            if resp.headers.get("Metadata-Flavor") == "Google":
                return f"the metadata server at {host}"
    except (aiohttp.ClientError, TimeoutError, OSError):
        pass
    return None


def _local(url: str) -> tuple[str | None, Path]:
    """Credentials named by the environment or left by gcloud (a file check, no network)."""
    adc = _gcloud_dir() / "application_default_credentials.json"
    explicit = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if explicit:
        if not Path(explicit).is_file():
            raise AccessDeniedError(f"{url}: GOOGLE_APPLICATION_CREDENTIALS names {explicit}, which "
                                    "is not a readable file")
        return "GOOGLE_APPLICATION_CREDENTIALS", adc
    if adc.is_file():
        return f"gcloud's application default credentials ({adc})", adc
    return None, adc


async def find_credentials(url: str, service_file: str | None, *, timeout_s: float = 1.0) -> str:
    """Where credentials for ``url`` will come from (for the log), or :class:`AccessDeniedError`
    saying none were found and how to provide them."""
    if service_file:
        return f"the service_file {service_file}"
    found, adc = _local(url)
    if found is None:
        found = await _metadata_server(timeout_s)
    if found is not None:
        return found
    raise AccessDeniedError(f"{url}: no Google Cloud credentials were found (no "
                            f"GOOGLE_APPLICATION_CREDENTIALS, no {adc}, and no metadata server "
                            f"answered at {metadata_host()} within {timeout_s:g}s): "
                            f"{HOW_TO_PROVIDE}")
