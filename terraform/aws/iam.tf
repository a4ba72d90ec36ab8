# Least privilege. The daemon's API policy (daemon_api) lists exactly the EC2, SQS, S3 and
# pricing actions that pricing/sources/aws.py, provisioner/drivers/aws.py and
# provisioner/drivers/artifacts.py call (tests/terraform compares both ways). Mutating EC2 actions only touch resources tagged spotring:job=<job_id>,
# launches only use this job's launch template, subnets, security group and worker AMI, and
# iam:PassRole only passes the worker role to EC2. The bootstrap policy (user data, not the
# Python code) reads the ring token; workers can read nothing else.

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    effect  = "Allow"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

# --- the daemon ------------------------------------------------------------------------------

data "aws_iam_policy_document" "daemon_api" {
  statement {
    sid    = "ReadPricesAndInstances"
    effect = "Allow"
    actions = [
      "ec2:DescribeInstanceTypeOfferings",
      "ec2:DescribeInstanceTypes",
      "ec2:DescribeInstances",
      "ec2:DescribeSpotPriceHistory",
      "ec2:DescribeSubnets",
      "ec2:GetSpotPlacementScores",
      "pricing:GetProducts",
    ]
    # These actions support no resource-level permissions.
    resources = ["*"]
  }

  statement {
    sid     = "LaunchOnlyJobTaggedInstances"
    effect  = "Allow"
    actions = ["ec2:CreateFleet", "ec2:RunInstances"]
    resources = [
      "${local.ec2_arn}:instance/*",
      "${local.ec2_arn}:volume/*",
      "${local.ec2_arn}:network-interface/*",
      "${local.ec2_arn}:spot-instances-request/*",
    ]

    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.job_tag}"
      values   = [var.job_id]
    }
  }

  statement {
    sid     = "LaunchOnlyFromThisJobsTemplate"
    effect  = "Allow"
    actions = ["ec2:CreateFleet", "ec2:RunInstances"]
    resources = concat(
      [
        aws_launch_template.worker.arn,
        aws_security_group.ring.arn,
        "arn:${local.partition}:ec2:${var.region}::image/${var.worker_ami_id}",
      ],
      [for s in var.subnet_ids : "${local.ec2_arn}:subnet/${s}"],
    )
  }

  # The fleet object of an instant EC2 Fleet carries no tags; what it launches is checked by the
  # two statements above (EC2 Fleet launches with the caller's RunInstances permissions).
  statement {
    sid       = "CreateInstantFleets"
    effect    = "Allow"
    actions   = ["ec2:CreateFleet"]
    resources = ["${local.ec2_arn}:fleet/*"]
  }

  statement {
    sid       = "TagOnlyAtLaunch"
    effect    = "Allow"
    actions   = ["ec2:CreateTags"]
    resources = ["${local.ec2_arn}:*/*"]

    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["CreateFleet", "RunInstances"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/${local.job_tag}"
      values   = [var.job_id]
    }
  }

  statement {
    sid       = "TerminateOnlyJobInstances"
    effect    = "Allow"
    actions   = ["ec2:TerminateInstances"]
    resources = ["${local.ec2_arn}:instance/*"]

    condition {
      test     = "StringEquals"
      variable = "ec2:ResourceTag/${local.job_tag}"
      values   = [var.job_id]
    }
  }

  statement {
    sid       = "PassOnlyTheWorkerRole"
    effect    = "Allow"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.worker.arn]

    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ec2.amazonaws.com"]
    }
  }

  # provisioner/drivers/artifacts.py: the wheel the daemon runs, stored with the run
  # (head_object, then put_object when absent) and fetched by the host's bootstrap.
  statement {
    sid       = "ShipTheRunsWheel"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject"]
    resources = ["${aws_s3_bucket.artifacts.arn}/${local.artifacts_prefix}/*"]
  }

  # provisioner/drivers/shiplog.py: the workers' shipped logs and exit reports
  # (<artifacts>/logs/, <artifacts>/exits/), listed and read (GetObject above).
  statement {
    sid       = "ListWorkersLogs"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.artifacts.arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${local.artifacts_prefix}/logs/*", "${local.artifacts_prefix}/exits/*"]
    }
  }

  statement {
    sid       = "ReadSpotNotices"
    effect    = "Allow"
    actions   = ["sqs:DeleteMessage", "sqs:ReceiveMessage"]
    resources = [aws_sqs_queue.notices.arn]
  }
}

data "aws_iam_policy_document" "read_ring_token" {
  statement {
    sid       = "ReadRingToken"
    effect    = "Allow"
    actions   = ["ssm:GetParameter"]
    resources = [aws_ssm_parameter.ring_token.arn]
  }
}

resource "aws_iam_role" "daemon" {
  name               = "${local.name}-daemon"
  description        = "spotring ${var.job_id} daemon: prices, worker launches, spot notices"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

resource "aws_iam_role_policy" "daemon_api" {
  name   = "spotring-api"
  role   = aws_iam_role.daemon.id
  policy = data.aws_iam_policy_document.daemon_api.json
}

resource "aws_iam_role_policy" "daemon_bootstrap" {
  name   = "spotring-bootstrap"
  role   = aws_iam_role.daemon.id
  policy = data.aws_iam_policy_document.read_ring_token.json
}

resource "aws_iam_instance_profile" "daemon" {
  name = "${local.name}-daemon"
  role = aws_iam_role.daemon.name
}

# --- the workers -----------------------------------------------------------------------------

resource "aws_iam_role" "worker" {
  name               = "${local.name}-worker"
  description        = "spotring ${var.job_id} GPU worker: reads the ring token, nothing else"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

resource "aws_iam_role_policy" "worker_bootstrap" {
  name   = "spotring-bootstrap"
  role   = aws_iam_role.worker.id
  policy = data.aws_iam_policy_document.read_ring_token.json
}

resource "aws_iam_instance_profile" "worker" {
  name = "${local.name}-worker"
  role = aws_iam_role.worker.name
}

# --- the ring token --------------------------------------------------------------------------

resource "aws_ssm_parameter" "ring_token" {
  #checkov:skip=CKV_AWS_337:The AWS-managed aws/ssm key is enough for a ring-membership token that never leaves the VPC's hosts; a CMK would add a key policy and kms:Decrypt grants to both roles for no gain in who can read it (IAM already limits that to this parameter).
  name             = "/spotring/${var.job_id}/ring-token"
  description      = "spotring ${var.job_id}: shared secret of the training ring"
  type             = "SecureString"
  value_wo         = var.ring_token
  value_wo_version = var.ring_token_version
}
