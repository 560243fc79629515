"""Re-export: `Request` lives in `pagedrt/core/request.py` (host-side bookkeeping, imported by
the KV manager, which imports nothing from `pagedrt/engine/`)."""

from pagedrt.core.request import PLACEHOLDER_TOKEN_ID, Request, RequestStatus

__all__ = ["PLACEHOLDER_TOKEN_ID", "Request", "RequestStatus"]
