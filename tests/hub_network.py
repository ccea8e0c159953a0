"""A machine without a network, as `huggingface_hub` sees it, whichever HTTP client its version uses."""

from __future__ import annotations

import importlib

import huggingface_hub
import huggingface_hub.constants


def hub_http_client():
    """The HTTP client module of the installed `huggingface_hub`: `httpx2` from version 2, `httpx` in version 1."""
    major = int(huggingface_hub.__version__.split(".")[0])
    return importlib.import_module("httpx2" if major >= 2 else "httpx")


def refuse_hub_requests(monkeypatch) -> list[str]:
    """Every HTTP request `huggingface_hub` makes fails as on a machine whose DNS answers nothing, with offline mode
    off so that requests are tried; returns the list the refused URLs are appended to."""
    client, requested = hub_http_client(), []

    def refuse(transport, request):
        requested.append(str(request.url))
        raise client.ConnectError("[Errno -2] Name or service not known", request=request)

    monkeypatch.setattr(client.HTTPTransport, "handle_request", refuse)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return requested
