# spotring on AWS: the daemon host, its least-privilege role, the GPU spot worker launch
# template, the ring security group and the spot notice queue fed by EventBridge.
#
# Rule for users: the daemon's IAM policy (iam.tf, daemon_api) must list exactly the calls
# that pricing/sources/aws.py and provisioner/drivers/aws.py make; tests/terraform checks it.

terraform {
  required_version = ">= 1.10"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.87, < 6.0"
    }
  }
}

provider "aws" {
  region = var.region

  default_tags {
    tags = merge(var.tags, {
      "spotring:job" = var.job_id
    })
  }
}

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  name       = "spotring-${var.job_id}"
  job_tag    = "spotring:job"

  ec2_arn = "arn:${local.partition}:ec2:${var.region}:${local.account_id}"

  coordinator_address = "${local.daemon_private_ip}:${var.coordinator_port}"
  token_path          = "/etc/spotring/ring-token"
}
