# The ring's durable snapshots (trainer/state/snapshot.py): s3://<artifacts bucket>/snapshots/
# <job_id>/ ([snapshot] url, with the job id the daemon appends). The coordinator inside the
# daemon keeps them (puts, reads, lists, forgets the oldest); while the daemon is away (killed,
# restarting), rank 0 writes its snapshot there itself (trainer/state/direct.py), so a kill of
# every worker during the outage costs one snapshot interval, not the whole outage. The worker's
# grant is the least that allows it: s3:PutObject under this job's snapshot prefix, no read,
# no delete, no list. Each manifest is signed with a key derived from the ring token (a put by
# anything without the token is refused by the coordinator); the bucket's versioning keeps an
# overwritten object for a day (the lifecycle rule below).

locals {
  snapshot_prefix = "snapshots"
  snapshot_url    = "s3://${aws_s3_bucket.artifacts.bucket}/${local.snapshot_prefix}"
  # what the daemon's store writes: <prefix>/<job_id>/<snapshot name>
  snapshot_job_prefix = "${local.snapshot_prefix}/${var.job_id}"
}

data "aws_iam_policy_document" "daemon_snapshots" {
  statement {
    sid       = "KeepTheRingsSnapshots"
    effect    = "Allow"
    actions   = ["s3:DeleteObject", "s3:GetObject", "s3:PutObject"]
    resources = ["${aws_s3_bucket.artifacts.arn}/${local.snapshot_job_prefix}/*"]
  }
  statement {
    sid       = "ListTheRingsSnapshots"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.artifacts.arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${local.snapshot_job_prefix}/*"]
    }
  }
}

data "aws_iam_policy_document" "worker_snapshots" {
  statement {
    sid       = "WriteSnapshotsWhileTheDaemonIsAway"
    effect    = "Allow"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.artifacts.arn}/${local.snapshot_job_prefix}/*"]
  }
}

resource "aws_iam_role_policy" "daemon_snapshots" {
  name   = "spotring-snapshots"
  role   = aws_iam_role.daemon.id
  policy = data.aws_iam_policy_document.daemon_snapshots.json
}

resource "aws_iam_role_policy" "worker_snapshots" {
  name   = "spotring-snapshots"
  role   = aws_iam_role.worker.id
  policy = data.aws_iam_policy_document.worker_snapshots.json
}
