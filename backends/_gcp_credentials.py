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
from vcasync.storage import shown_url

__all__ = ["HOW_TO_PROVIDE", "find_credentials", "shown_source"]

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


def shown_source(value: str) -> str:
    """A credential source (``GOOGLE_APPLICATION_CREDENTIALS``, a ``service_file``) as an error or
    a log line may show it. A path is shown, through :func:`shown_url` (a URL put there by mistake
    loses its user info and query values); a value that is not a path is never shown: it is
    often the key file's JSON pasted in place of its path, private key included."""
    if value.lstrip().startswith("{") or "\n" in value or "\r" in value:
        return f"a value that is not a path ({len(value)} characters, not shown: it may be the key itself)"
    return shown_url(value)


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
            raise AccessDeniedError(f"{shown_url(url)}: GOOGLE_APPLICATION_CREDENTIALS names "
                                    f"{shown_source(explicit)}, which is not a readable file")
        return "GOOGLE_APPLICATION_CREDENTIALS", adc
    if adc.is_file():
        return f"gcloud's application default credentials ({adc})", adc
    return None, adc


async def find_credentials(url: str, service_file: str | None, *, timeout_s: float = 1.0) -> str:
    """Where credentials for ``url`` will come from (for the log), or :class:`AccessDeniedError`
    saying none were found and how to provide them. Neither shows a secret: ``url`` is shown
    through :func:`shown_url`, a credential file through :func:`shown_source`."""
    if service_file:
        return f"the service_file {shown_source(service_file)}"
    found, adc = _local(url)
    if found is None:
        found = await _metadata_server(timeout_s)
    if found is not None:
        return found
    raise AccessDeniedError(f"{shown_url(url)}: no Google Cloud credentials were found (no "
                            f"GOOGLE_APPLICATION_CREDENTIALS, no {adc}, and no metadata server "
                            f"answered at {metadata_host()} within {timeout_s:g}s): "
                            f"{HOW_TO_PROVIDE}")
