# One security group for the ring: the daemon (coordinator) and every worker carry it. Members
# reach the coordinator port and each other's ring ports; nothing is open from outside. Egress
# is the ring itself plus HTTPS (pip, the AWS APIs, SSM). Rules are inline so that one resource
# owns them all (no drift between separately managed rules).

resource "aws_security_group" "ring" {
  name        = "${local.name}-ring"
  description = "spotring ${var.job_id}: ring members reach the coordinator and each other only"
  vpc_id      = var.vpc_id

  ingress {
    description = "workers to the ring coordinator (TCPStore)"
    protocol    = "tcp"
    from_port   = var.coordinator_port
    to_port     = var.coordinator_port
    self        = true
  }

  ingress {
    description = "workers to each other (gloo/NCCL ring)"
    protocol    = "tcp"
    from_port   = var.ring_ports.from
    to_port     = var.ring_ports.to
    self        = true
  }

  egress {
    description = "to the ring coordinator"
    protocol    = "tcp"
    from_port   = var.coordinator_port
    to_port     = var.coordinator_port
    self        = true
  }

  egress {
    description = "to other ring members"
    protocol    = "tcp"
    from_port   = var.ring_ports.from
    to_port     = var.ring_ports.to
    self        = true
  }

  egress {
    description = "HTTPS out: pip, AWS APIs (EC2, SQS, pricing, SSM)"
    protocol    = "tcp"
    from_port   = 443
    to_port     = 443
    cidr_blocks = ["0.0.0.0/0"]
  }

  tags = {
    Name = "${local.name}-ring"
  }
}

# The coordinator's address must be known to the worker launch template before the daemon host
# exists (the host's config names the template): the host gets a fixed private address in the
# first subnet, which also survives a replacement of the host.
data "aws_subnet" "daemon" {
  id = var.subnet_ids[0]
}

# Zone of each worker subnet: the daemon launches an offering's zone into its subnet.
data "aws_subnet" "worker" {
  for_each = toset(var.subnet_ids)
  id       = each.value
}

locals {
  daemon_private_ip = cidrhost(data.aws_subnet.daemon.cidr_block, var.daemon_host_number)
}
