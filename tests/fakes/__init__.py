"""Fakes of cloud APIs used by the tests (a fake beside the real client, httpx MockTransport style)."""
