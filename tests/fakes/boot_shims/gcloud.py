"""``gcloud`` of a fake instance: ``secrets versions access latest`` against
$CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER and ``storage cp`` (``gs://...`` to a file, or
``-`` for stdin to an object) against
$CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE (the tests' fakes); anything else exits 2."""

import base64
import json
import os
import sys
import urllib.request


def opt(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def main(argv: list[str]) -> int:
    if argv[:4] == ["secrets", "versions", "access", "latest"]:
        base = os.environ["CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER"].rstrip("/")
        url = (f"{base}/v1/projects/{opt(argv, '--project')}/secrets/{opt(argv, '--secret')}"
               f"/versions/latest:access")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - a local fake
                data = json.loads(r.read())["payload"]["data"]
        except OSError as exc:
            print(f"ERROR: (gcloud.secrets.versions.access) {exc}", file=sys.stderr)
            return 1
        sys.stdout.write(base64.b64decode(data).decode())
        return 0
    if argv[:2] == ["storage", "cp"]:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        src, dst = [a for a in argv[2:] if not a.startswith("--")]
        bucket, _, name = (dst if src == "-" else src).removeprefix("gs://").partition("/")
        client = storage.Client(project="fake", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": os.environ[
                                    "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE"].rstrip("/")})
        try:
            if src == "-":
                client.bucket(bucket).blob(name).upload_from_string(sys.stdin.buffer.read())
            else:
                client.bucket(bucket).blob(name).download_to_filename(dst)
        except Exception as exc:  # noqa: BLE001 - as the CLI: one line, exit 1
            print(f"ERROR: (gcloud.storage.cp) {exc}", file=sys.stderr)
            return 1
        return 0
    print(f"gcloud (fake): unsupported: {' '.join(argv)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
