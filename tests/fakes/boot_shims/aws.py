"""``aws`` of a fake instance: ``ssm get-parameter`` and ``s3 cp`` (a download, or ``-`` for
stdin to an object) against $AWS_ENDPOINT_URL (a moto server), with the instance's credentials
from the environment; anything else exits 2."""

import sys


def opt(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def main(argv: list[str]) -> int:
    import os

    import boto3

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    region = opt(argv, "--region", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    if argv[:2] == ["ssm", "get-parameter"]:
        ssm = boto3.client("ssm", region_name=region, endpoint_url=endpoint)
        value = ssm.get_parameter(Name=opt(argv, "--name"),
                                  WithDecryption="--with-decryption" in argv)["Parameter"]["Value"]
        print(value)  # --output text: the value and a newline
        return 0
    if argv[:2] == ["s3", "cp"]:
        args, rest = [], iter(argv[2:])
        for a in rest:
            if a == "--region":
                next(rest)
            elif not a.startswith("--"):
                args.append(a)
        src, dst = args
        s3 = boto3.client("s3", region_name=region, endpoint_url=endpoint)
        try:
            if src == "-":
                bucket, _, key = dst.removeprefix("s3://").partition("/")
                s3.put_object(Bucket=bucket, Key=key, Body=sys.stdin.buffer.read())
                return 0
            bucket, _, key = src.removeprefix("s3://").partition("/")
            s3.download_file(bucket, key, dst)
        except Exception as exc:  # noqa: BLE001 - as the CLI: one line, exit 1
            print(f"fatal error: {exc}", file=sys.stderr)
            return 1
        return 0
    print(f"aws (fake): unsupported: {' '.join(argv)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
