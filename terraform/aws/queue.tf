# Spot notices: EventBridge rules for the interruption warning, the rebalance recommendation and
# instance state changes feed one SQS queue that the daemon long-polls. The queue policy lets
# only these rules send, and refuses anything not over TLS.

locals {
  queue_name = "${local.name}-notices"
  queue_arn  = "arn:${local.partition}:sqs:${var.region}:${local.account_id}:${local.queue_name}"

  notice_rules = {
    interruption = {
      description = "EC2 Spot Instance Interruption Warning (2 minutes before reclaim)"
      pattern = {
        source      = ["aws.ec2"]
        detail-type = ["EC2 Spot Instance Interruption Warning"]
      }
    }
    rebalance = {
      description = "EC2 Instance Rebalance Recommendation (elevated reclaim risk)"
      pattern = {
        source      = ["aws.ec2"]
        detail-type = ["EC2 Instance Rebalance Recommendation"]
      }
    }
    state-change = {
      description = "EC2 Instance State-change Notification (stopping, terminated, ...)"
      pattern = {
        source      = ["aws.ec2"]
        detail-type = ["EC2 Instance State-change Notification"]
      }
    }
  }
}

resource "aws_sqs_queue" "notices" {
  name                       = local.queue_name
  sqs_managed_sse_enabled    = true
  message_retention_seconds  = var.notice_retention_seconds
  receive_wait_time_seconds  = 20
  visibility_timeout_seconds = 60
  # Inline (not aws_sqs_queue_policy): the rule ARNs are known before the queue, and one
  # resource saves a second attribute-propagation wait on apply and destroy.
  policy = data.aws_iam_policy_document.notice_queue.json
}

resource "aws_cloudwatch_event_rule" "notice" {
  for_each = local.notice_rules

  name          = "${local.name}-${each.key}"
  description   = "spotring ${var.job_id}: ${each.value.description}"
  event_pattern = jsonencode(each.value.pattern)
}

resource "aws_cloudwatch_event_target" "notice" {
  for_each = local.notice_rules

  rule      = aws_cloudwatch_event_rule.notice[each.key].name
  target_id = "spotring-notices"
  arn       = aws_sqs_queue.notices.arn
}

data "aws_iam_policy_document" "notice_queue" {
  statement {
    sid       = "OnlyTheNoticeRules"
    effect    = "Allow"
    actions   = ["sqs:SendMessage"]
    resources = [local.queue_arn]

    principals {
      type        = "Service"
      identifiers = ["events.amazonaws.com"]
    }

    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = [for rule in aws_cloudwatch_event_rule.notice : rule.arn]
    }
  }

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["sqs:*"]
    resources = [local.queue_arn]

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

