# The daemon host: a small on-demand instance running `provision run` as a systemd unit. It is
# the stable member of the ring (the coordinator runs inside the daemon), reached through a
# fixed private address that the worker template names.

data "aws_ssm_parameter" "al2023" {
  count = var.daemon_ami_id == null ? 1 : 0
  name  = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
}

locals {
  daemon_ami_id = var.daemon_ami_id != null ? var.daemon_ami_id : nonsensitive(data.aws_ssm_parameter.al2023[0].value)

  # What `provision run` needs; outputs.tf exposes the same map and terraform/render_config.py
  # turns `terraform output -json` into the same TOML.
  daemon_settings = {
    cloud              = "aws"
    job_id             = var.job_id
    job_file           = var.job_module
    region             = var.region
    price_regions      = length(var.price_regions) > 0 ? var.price_regions : [var.region]
    max_workers        = var.max_workers
    launch_template_id = aws_launch_template.worker.id
    queue_url          = aws_sqs_queue.notices.url
    # Keyed by zone name and by zone id: price sources name zones either way (use1-az1).
    subnets = merge(
      { for s in data.aws_subnet.worker : s.availability_zone => s.id },
      { for s in data.aws_subnet.worker : s.availability_zone_id => s.id },
    )
    # The coordinator listens on the host's private address only (not 0.0.0.0); the security
    # group admits ring members to it. No metrics port: the daemon's metrics stay off (or on
    # loopback when asked for on the command line).
    coordinator_host = local.daemon_private_ip
    coordinator_port = var.coordinator_port
    token_path       = local.token_path
    state_path       = "/var/lib/spotring/state.sqlite"
    # The run's artifacts: the daemon stores the wheel it runs there and pins it on every
    # launch; `wheel` is where the daemon host keeps that wheel ("" with the index opt-in).
    artifacts = var.spotring_wheel == null ? "" : local.artifacts_url
    wheel     = var.spotring_wheel == null ? "" : "/opt/spotring-dist/${basename(var.spotring_wheel)}"
    # The ring's snapshots (snapshots.tf): the workers may put there while the daemon is away
    snapshot_url = local.snapshot_url
  }
}

resource "aws_instance" "daemon" {
  ami                  = local.daemon_ami_id
  instance_type        = var.daemon_instance_type
  iam_instance_profile = aws_iam_instance_profile.daemon.name
  ebs_optimized        = true
  monitoring           = var.daemon_detailed_monitoring

  user_data_replace_on_change = true
  user_data = templatefile("${path.module}/templates/daemon-user-data.sh.tftpl", {
    region            = var.region
    token_parameter   = aws_ssm_parameter.ring_token.name
    token_path        = local.token_path
    wheel_url         = local.wheel_url
    wheel_sha256      = local.wheel_sha256
    wheel_path        = local.daemon_settings.wheel
    index_requirement = var.spotring_index_requirement == null ? "" : var.spotring_index_requirement
    config_toml       = templatefile("${path.module}/templates/daemon-config.toml.tftpl", local.daemon_settings)
  })

  subnet_id              = var.subnet_ids[0]
  private_ip             = local.daemon_private_ip
  vpc_security_group_ids = [aws_security_group.ring.id]

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  root_block_device {
    volume_type = "gp3"
    volume_size = 20
    encrypted   = true
  }

  tags = {
    Name = "${local.name}-daemon"
  }

  lifecycle {
    # A newer Amazon Linux image must not replace a running daemon; set daemon_ami_id to move.
    ignore_changes = [ami]
  }
}
