"""The one place boto3 clients are made: retries by botocore's config, errors translated.

Design: every AWS call in spotring (the price source and the EC2/SQS driver) goes through a
client made here, with botocore's *adaptive* retry mode (client-side rate limiting plus
exponential backoff on throttling), so no driver writes its own retry loop. Credential
problems become :class:`pricing.errors.CredentialsError` with a message that says how to fix
them.

Rule for callers: create clients with :func:`make_client`; wrap calls that may fail on
credentials in :func:`translate_errors`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from pricing.errors import CredentialsError, SourceError

#: botocore total attempts, the first call included (``total_max_attempts``; botocore's
#: ``max_attempts`` would count retries only). Throttling on DescribeSpotPriceHistory
#: and CreateFleet is common under a fan-out across regions; 8 attempts with adaptive backoff
#: rides out bursts of about 20 s without making a daemon tick slower than its interval.
MAX_ATTEMPTS = 8

#: Error codes with which AWS rejects the credentials themselves (missing, wrong, expired).
REJECTED_CREDENTIAL_CODES = frozenset({
    "AuthFailure", "UnrecognizedClientException", "InvalidClientTokenId", "ExpiredToken",
    "SignatureDoesNotMatch",
})

CREDENTIALS_HELP = (
    "no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
    "(or run on an instance with a role), or use --source trace"
)


def make_client(service: str, region: str, *, endpoint_url: str | None = None,
                max_attempts: int = MAX_ATTEMPTS) -> Any:
    """A boto3 client with adaptive retries. ``endpoint_url`` points it at e.g. a moto server."""
    import boto3  # lazy: importing boto3 costs ~0.3 s, not paid by commands that never call AWS
    from botocore.config import Config

    config = Config(retries={"total_max_attempts": max_attempts, "mode": "adaptive"},
                    connect_timeout=10, read_timeout=30)
    # A session of its own, not boto3's process-wide default one, which caches the credentials
    # it first resolved: a client made later must see the environment as it is now.
    session = boto3.session.Session()
    return session.client(service, region_name=region, endpoint_url=endpoint_url, config=config)


@contextlib.contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Translate botocore credential and connection errors into pricing errors."""
    from botocore.exceptions import (ClientError, EndpointConnectionError, NoCredentialsError,
                                     PartialCredentialsError)

    try:
        yield
    except (NoCredentialsError, PartialCredentialsError):
        raise CredentialsError(CREDENTIALS_HELP) from None
    except EndpointConnectionError as exc:
        raise SourceError(f"{what}: cannot reach AWS endpoint: {exc}") from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in REJECTED_CREDENTIAL_CODES:
            raise CredentialsError(f"{what}: AWS rejected the credentials ({code}); "
                                   f"{CREDENTIALS_HELP}") from None
        raise
