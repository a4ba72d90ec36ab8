# The GPU worker launch template. The daemon launches from it with the instance type, subnet and
# spot market of the offering it chose (a launch template used by EC2 Fleet may not carry
# InstanceMarketOptions, so the market is set per launch, not here). User data reads the
# launch's values (spotring:env:* tags, instance metadata tags enabled below), installs the
# spotring wheel the daemon ships (pinned by SHA-256) and starts one `python -m trainer worker`
# per GPU against the coordinator on the daemon host.

resource "aws_launch_template" "worker" {
  name                   = "${local.name}-worker"
  description            = "spotring ${var.job_id} GPU spot worker"
  image_id               = var.worker_ami_id
  instance_type          = var.worker_instance_type
  vpc_security_group_ids = [aws_security_group.ring.id]
  ebs_optimized          = true
  update_default_version = true

  user_data = base64encode(templatefile("${path.module}/templates/worker-user-data.sh.tftpl", {
    region            = var.region
    coordinator       = local.coordinator_address
    token_parameter   = aws_ssm_parameter.ring_token.name
    token_path        = local.token_path
    job_module        = var.job_module
    extra_args        = var.worker_extra_args
    python            = var.worker_python
    artifacts         = local.artifacts_url
    wheel_url         = local.wheel_url
    wheel_sha256      = local.wheel_sha256
    index_requirement = var.spotring_index_requirement == null ? "" : var.spotring_index_requirement
  }))

  iam_instance_profile {
    arn = aws_iam_instance_profile.worker.arn
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "enabled"
  }

  block_device_mappings {
    device_name = "/dev/sda1"

    ebs {
      volume_size           = var.worker_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags = merge(var.tags, {
      Name            = "${local.name}-worker"
      (local.job_tag) = var.job_id
    })
  }

  tag_specifications {
    resource_type = "volume"
    tags = merge(var.tags, {
      (local.job_tag) = var.job_id
    })
  }
}
