"""A small local HTTP fake of the read-only GCP endpoints the GCP price source calls.

Design: the real google-cloud-compute and google-cloud-billing clients (``transport="rest"``,
``ClientOptions(api_endpoint="http://127.0.0.1:PORT")``, ``AnonymousCredentials()``) talk to
it, so request paths, paging and the JSON mapping are exercised for real. It serves:

- ``GET /compute/v1/projects/P/zones``;
- ``GET /compute/v1/projects/P/aggregated/machineTypes`` and ``.../aggregated/acceleratorTypes``;
- ``GET /v1/services/6F81-5844-456A/skus`` in pages of :attr:`GcpCatalogFake.page_size`
  (``pageToken`` is the offset), so the client's pager must follow ``nextPageToken``;
- ``POST /compute/v1/projects/P/regions/R/advice/capacityHistory``: the preemption history
  of :attr:`GcpCatalogFake.capacity_history` for the machine type asked (404 without).

``fail_next(path_part, status)`` answers the next request whose path contains ``path_part``
with an HTTP error. Use as a context manager; it serves from a daemon thread on port 0 (the
scaffold of :mod:`tests.fakes.http_fake`).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.fakes.http_fake import HttpFake, JsonHandler

COMPUTE_SERVICE = "services/6F81-5844-456A"


def money(usd: float) -> dict[str, Any]:
    units = int(usd)
    return {"currencyCode": "USD", "units": str(units), "nanos": round((usd - units) * 1e9)}


def sku(description: str, usage: str, regions: list[str], usd: float, unit: str = "h",
        group: str = "GPU") -> dict[str, Any]:
    """One Cloud Billing SKU in the REST JSON shape."""
    return {
        "name": f"{COMPUTE_SERVICE}/skus/{abs(hash((description, usage))) % 10**8:08d}",
        "description": description,
        "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                     "resourceGroup": group, "usageType": usage},
        "serviceRegions": regions,
        "pricingInfo": [{"effectiveTime": "2024-05-01T00:00:00Z", "pricingExpression": {
            "usageUnit": unit, "displayQuantity": 1,
            "tieredRates": [{"startUsageAmount": 0, "unitPrice": money(usd)}]}}],
    }


class GcpCatalogFake(HttpFake):
    """Zones, machine and accelerator types, and Compute Engine SKUs of one project."""

    def __init__(self, *, zones: dict[str, str], machine_types: dict[str, list[dict]],
                 accelerator_types: dict[str, dict[str, int]], skus: list[dict], page_size: int = 2,
                 capacity_history: dict[tuple[str, str], list[tuple[str, float, str]]] | None = None
                 ) -> None:
        self.zones = zones                      # zone -> region
        self.machine_types = machine_types      # zone -> [machineType JSON]
        self.accelerator_types = accelerator_types  # zone -> {accelerator name: max cards}
        self.skus = skus
        self.page_size = page_size
        # (region, machine type) -> [(location URL, preemption rate, interval end time)]
        self.capacity_history = capacity_history or {}
        self.bodies: list[Any] = []
        self.requests: list[str] = []
        self._fail: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def fail_next(self, path_part: str, status: int) -> None:
        with self._lock:
            self._fail.append((path_part, status))

    def _answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(path)
            for i, (part, status) in enumerate(self._fail):
                if part in path:
                    del self._fail[i]
                    return status, {"error": {"code": status, "message": f"injected {status}",
                                              "status": "UNAVAILABLE" if status >= 500 else "PERMISSION_DENIED"}}
        parts = path.strip("/").split("/")
        if parts[:2] == ["compute", "v1"] and len(parts) == 5 and parts[4] == "zones":
            return 200, {"items": [{"name": z, "status": "UP", "region":
                                    f"https://www.googleapis.com/compute/v1/projects/{parts[3]}/regions/{r}"}
                                   for z, r in self.zones.items()]}
        if parts[:2] == ["compute", "v1"] and len(parts) == 6 and parts[4] == "aggregated":
            if parts[5] == "machineTypes":
                return 200, {"items": {f"zones/{z}": {"machineTypes": [dict(m, zone=z) for m in mts]}
                                       for z, mts in self.machine_types.items()}}
            if parts[5] == "acceleratorTypes":
                return 200, {"items": {f"zones/{z}": {"acceleratorTypes": [
                    {"name": a, "zone": z, "maximumCardsPerInstance": n} for a, n in names.items()]}
                    for z, names in self.accelerator_types.items()}}
        if path == f"/v1/{COMPUTE_SERVICE}/skus":
            start = int(query.get("pageToken", ["0"])[0] or 0)
            page = self.skus[start:start + self.page_size]
            body: dict[str, Any] = {"skus": page}
            if start + self.page_size < len(self.skus):
                body["nextPageToken"] = str(start + self.page_size)
            return 200, body
        return 404, {"error": {"code": 404, "message": f"no route {path}", "status": "NOT_FOUND"}}

    def _post(self, path: str, body: Any) -> tuple[int, Any]:
        with self._lock:
            self.requests.append(path)
            self.bodies.append(body)
        parts = path.strip("/").split("/")
        if parts[:2] == ["compute", "v1"] and parts[-2:] == ["advice", "capacityHistory"]:
            region = parts[5]
            mtype = ((body or {}).get("instanceProperties") or {}).get("machineType", "")
            records = self.capacity_history.get((region, mtype))
            if records is None:
                return 404, {"error": {"code": 404, "message": "no history", "status": "NOT_FOUND"}}
            loc, _, _ = records[0]
            return 200, {"location": loc, "machineType": mtype, "preemptionHistory": [
                {"interval": {"startTime": "2026-01-01T00:00:00Z", "endTime": end},
                 "preemptionRate": rate} for _, rate, end in records]}
        return 404, {"error": {"code": 404, "message": f"no route {path}", "status": "NOT_FOUND"}}

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                url = urlparse(self.path)
                self._send(*fake._answer(url.path, parse_qs(url.query)))

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                self._send(*fake._post(urlparse(self.path).path,
                                       json.loads(raw) if raw else None))

        return Handler
