# The run's artifacts: a private bucket holding the spotring wheel the daemon and the workers
# install, content-addressed (artifacts/<sha256>/<file>). Terraform uploads var.spotring_wheel
# there; the daemon host installs it, pinned by that SHA-256, and ships the same file with every
# launch ([cloud] artifacts, provisioner/drivers/artifacts.py). Nothing is installed by name from
# a package index unless var.spotring_index_requirement (pinned and hashed) asks for it.

locals {
  artifacts_prefix = "artifacts"
  artifacts_url    = "s3://${aws_s3_bucket.artifacts.bucket}/${local.artifacts_prefix}/"
  wheel_sha256     = var.spotring_wheel == null ? "" : filesha256(var.spotring_wheel)
  wheel_key        = var.spotring_wheel == null ? "" : "${local.artifacts_prefix}/${local.wheel_sha256}/${basename(var.spotring_wheel)}"
  wheel_url        = var.spotring_wheel == null ? "" : "s3://${aws_s3_bucket.artifacts.bucket}/${local.wheel_key}"
}

resource "aws_s3_bucket" "artifacts" {
  #checkov:skip=CKV_AWS_18:Access logs of a bucket read only by this job's two roles would need a second bucket (and its own logging) for no added control; CloudTrail data events cover it when the account wants them.
  #checkov:skip=CKV_AWS_144:Cross-region replication of a wheel terraform can upload again adds a bucket, a role and a region for nothing.
  #checkov:skip=CKV_AWS_145:SSE-S3 (AES256, below) encrypts at rest; a CMK would add a key policy and kms:Decrypt grants to both roles for no gain in who can read it (IAM already limits that).
  #checkov:skip=CKV2_AWS_62:Nothing reacts to uploads: the daemon knows what it stored.
  bucket_prefix = "${substr(local.name, 0, 30)}-artifacts-"
  force_destroy = true # only content-addressed copies of a wheel the user keeps
}

resource "aws_s3_bucket_public_access_block" "artifacts" {
  bucket                  = aws_s3_bucket.artifacts.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "artifacts" {
  bucket = aws_s3_bucket.artifacts.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "artifacts" {
  bucket = aws_s3_bucket.artifacts.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_versioning" "artifacts" {
  bucket = aws_s3_bucket.artifacts.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "artifacts" {
  bucket = aws_s3_bucket.artifacts.id
  rule {
    id     = "old-versions-and-uploads"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = 30
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
  # snapshots (snapshots.tf) are large and replaced every interval: the ones the coordinator
  # forgets, or a worker overwrites, are kept one day, not thirty
  rule {
    id     = "forgotten-snapshots"
    status = "Enabled"
    filter {
      prefix = "${local.snapshot_prefix}/"
    }
    noncurrent_version_expiration {
      noncurrent_days = 1
    }
  }
}

resource "aws_s3_bucket_policy" "artifacts" {
  bucket = aws_s3_bucket.artifacts.id
  policy = data.aws_iam_policy_document.artifacts_bucket.json
}

data "aws_iam_policy_document" "artifacts_bucket" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.artifacts.arn, "${aws_s3_bucket.artifacts.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_object" "wheel" {
  count = var.spotring_wheel == null ? 0 : 1

  bucket       = aws_s3_bucket.artifacts.id
  key          = local.wheel_key
  source       = var.spotring_wheel
  source_hash  = local.wheel_sha256
  content_type = "application/zip"

  depends_on = [aws_s3_bucket_server_side_encryption_configuration.artifacts]
}

# Workers read the artifacts (their wheel) and nothing else of the bucket; they write only
# their shipped log chunks and exit reports (logs/, exits/: the boot's log shipping,
# provisioner/drivers/shiplog.py), and list nothing.
data "aws_iam_policy_document" "read_artifacts" {
  statement {
    sid       = "ReadRunArtifacts"
    effect    = "Allow"
    actions   = ["s3:GetObject"]
    resources = ["${aws_s3_bucket.artifacts.arn}/${local.artifacts_prefix}/*"]
  }
  statement {
    sid     = "ShipWorkerLogs"
    effect  = "Allow"
    actions = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.artifacts.arn}/${local.artifacts_prefix}/logs/*",
    "${aws_s3_bucket.artifacts.arn}/${local.artifacts_prefix}/exits/*"]
  }
}

resource "aws_iam_role_policy" "worker_artifacts" {
  name   = "spotring-artifacts"
  role   = aws_iam_role.worker.id
  policy = data.aws_iam_policy_document.read_artifacts.json
}
