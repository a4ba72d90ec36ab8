output "region" {
  description = "Region of the deployment ([aws] region)."
  value       = var.region
}

output "job_id" {
  description = "Job id tagging every worker ([job] id)."
  value       = var.job_id
}

output "launch_template_id" {
  description = "Worker launch template id ([aws] launch_template)."
  value       = aws_launch_template.worker.id
}

output "launch_template_name" {
  description = "Worker launch template name."
  value       = aws_launch_template.worker.name
}

output "queue_url" {
  description = "SQS queue of spot notices ([aws] queue_url)."
  value       = aws_sqs_queue.notices.url
}

output "queue_arn" {
  description = "ARN of the notice queue."
  value       = aws_sqs_queue.notices.arn
}

output "notice_rule_arns" {
  description = "EventBridge rules feeding the notice queue, by kind."
  value       = { for k, rule in aws_cloudwatch_event_rule.notice : k => rule.arn }
}

output "subnet_ids" {
  description = "Subnets the workers may launch in ([aws] subnet_ids)."
  value       = var.subnet_ids
}

output "security_group_id" {
  description = "The ring security group (daemon and workers)."
  value       = aws_security_group.ring.id
}

output "coordinator_address" {
  description = "host:port of the ring coordinator on the daemon host."
  value       = local.coordinator_address
}

output "daemon_instance_id" {
  description = "The daemon host."
  value       = aws_instance.daemon.id
}

output "daemon_role_arn" {
  description = "Role of the daemon host (least privilege)."
  value       = aws_iam_role.daemon.arn
}

output "worker_role_arn" {
  description = "Role of the workers (reads the ring token only)."
  value       = aws_iam_role.worker.arn
}

output "worker_instance_profile_arn" {
  description = "Instance profile the launch template gives workers."
  value       = aws_iam_instance_profile.worker.arn
}

output "token_parameter" {
  description = "SSM SecureString holding the ring token."
  value       = aws_ssm_parameter.ring_token.name
}

output "daemon_settings" {
  description = "Everything the daemon's config needs; terraform/render_config.py turns it into TOML."
  value       = local.daemon_settings
}
