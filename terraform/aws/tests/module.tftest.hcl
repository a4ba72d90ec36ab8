# Plan/apply of terraform/aws against a mocked AWS provider: wiring, least privilege and input
# validation, with no cloud account. Run by tests/terraform (terraform test).

mock_provider "aws" {
  # ARNs the provider validates where they are passed on (event targets, the template's
  # instance profile), and those the IAM statements name.
  mock_resource "aws_sqs_queue" {
    defaults = {
      arn = "arn:aws:sqs:us-east-1:123456789012:spotring-tftest-notices"
      url = "https://sqs.us-east-1.amazonaws.com/123456789012/spotring-tftest-notices"
    }
  }

  mock_resource "aws_iam_instance_profile" {
    defaults = {
      arn = "arn:aws:iam::123456789012:instance-profile/spotring-tftest"
    }
  }

  mock_resource "aws_iam_role" {
    defaults = {
      arn = "arn:aws:iam::123456789012:role/spotring-tftest"
    }
  }

  mock_resource "aws_launch_template" {
    defaults = {
      id  = "lt-0123456789abcdef0"
      arn = "arn:aws:ec2:us-east-1:123456789012:launch-template/lt-0123456789abcdef0"
    }
  }

  mock_data "aws_subnet" {
    defaults = {
      cidr_block           = "10.0.1.0/24"
      availability_zone    = "us-east-1a"
      availability_zone_id = "use1-az1"
    }
  }

  mock_data "aws_caller_identity" {
    defaults = {
      account_id = "123456789012"
    }
  }

  # A syntactically valid policy: the provider validates policy JSON even when mocked. The
  # statements themselves are asserted on the data source's inputs below.
  mock_data "aws_iam_policy_document" {
    defaults = {
      json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}"
    }
  }

  mock_data "aws_partition" {
    defaults = {
      partition = "aws"
    }
  }
}

variables {
  job_id        = "tftest"
  job_module    = "examples.digits"
  vpc_id        = "vpc-0123456789abcdef0"
  subnet_ids    = ["subnet-0123456789abcdef0"]
  worker_ami_id = "ami-0123456789abcdef0"
  daemon_ami_id = "ami-0fedcba9876543210"
  ring_token    = "0123456789abcdef0123456789abcdef"
  # a fixture file (not a wheel): terraform uploads it and pins its SHA-256, nothing installs it
  spotring_wheel = "tests/spotring-0.0.0-py3-none-any.whl"
}

run "wires_least_privilege_and_closed_network" {
  command = apply

  assert {
    condition     = output.coordinator_address == "10.0.1.10:29500"
    error_message = "the coordinator must sit at the fixed host address of the first subnet"
  }

  assert {
    condition     = aws_instance.daemon.private_ip == "10.0.1.10" && aws_instance.daemon.subnet_id == "subnet-0123456789abcdef0"
    error_message = "the daemon host must own the coordinator address"
  }

  assert {
    condition     = strcontains(base64decode(aws_launch_template.worker.user_data), "-m trainer worker --coordinator 10.0.1.10:29500 --token-file /etc/spotring/ring-token --job $job")
    error_message = "workers must start the trainer against the coordinator"
  }

  assert {
    condition     = strcontains(base64decode(aws_launch_template.worker.user_data), "job=$${job:-'examples.digits'}")
    error_message = "workers must train the module's job_module unless the launch names another (spotring:env:SPOTRING_JOB)"
  }

  # Nothing of spotring comes from a package index: the wheel goes to the artifacts bucket
  # under its SHA-256, and the workers and the daemon host install it pinned by it.
  assert {
    condition     = aws_s3_object.wheel[0].key == "artifacts/${filesha256("tests/spotring-0.0.0-py3-none-any.whl")}/spotring-0.0.0-py3-none-any.whl"
    error_message = "the wheel must be stored content-addressed under artifacts/<sha256>/"
  }

  assert {
    condition     = strcontains(base64decode(aws_launch_template.worker.user_data), "sha='${filesha256("tests/spotring-0.0.0-py3-none-any.whl")}'") && strcontains(base64decode(aws_launch_template.worker.user_data), "--no-deps --require-hashes") && !strcontains(base64decode(aws_launch_template.worker.user_data), "pip install --upgrade")
    error_message = "workers must install the wheel pinned by its SHA-256, and nothing by name"
  }

  assert {
    condition     = strcontains(aws_instance.daemon.user_data, "wheel = \"/opt/spotring-dist/spotring-0.0.0-py3-none-any.whl\"") && strcontains(aws_instance.daemon.user_data, "artifacts = \"s3://") && strcontains(aws_instance.daemon.user_data, "sha256sum -c")
    error_message = "the daemon host must install the same wheel, checked, and ship it ([cloud] wheel and artifacts)"
  }

  assert {
    condition     = aws_s3_bucket_public_access_block.artifacts.block_public_acls && aws_s3_bucket_public_access_block.artifacts.block_public_policy && aws_s3_bucket_public_access_block.artifacts.ignore_public_acls && aws_s3_bucket_public_access_block.artifacts.restrict_public_buckets
    error_message = "the artifacts bucket must never be public"
  }

  assert {
    condition     = [for s in data.aws_iam_policy_document.read_artifacts.statement : s.actions] == [toset(["s3:GetObject"]), toset(["s3:PutObject"])]
    error_message = "workers may only read the artifacts, and put their shipped logs"
  }

  assert {
    condition     = alltrue([for r in data.aws_iam_policy_document.read_artifacts.statement[1].resources : endswith(r, "/artifacts/logs/*") || endswith(r, "/artifacts/exits/*")])
    error_message = "workers may put objects under artifacts/logs/ and artifacts/exits/ only (their shipped log chunks and exit reports)"
  }

  assert {
    condition     = [for s in data.aws_iam_policy_document.worker_snapshots.statement : s.actions] == [toset(["s3:PutObject"])] && alltrue([for r in data.aws_iam_policy_document.worker_snapshots.statement[0].resources : endswith(r, "/snapshots/${var.job_id}/*")])
    error_message = "workers may only put the ring's snapshots, under snapshots/<job_id>/ (no read, delete or list)"
  }

  assert {
    condition     = strcontains(aws_instance.daemon.user_data, "[snapshot]") && strcontains(aws_instance.daemon.user_data, "direct = true") && strcontains(aws_instance.daemon.user_data, "/snapshots\"")
    error_message = "the daemon must keep the ring's snapshots in the module's bucket and tell the workers they may put there"
  }

  assert {
    condition     = strcontains(aws_instance.daemon.user_data, "provision run --config /etc/spotring/config.toml") && strcontains(aws_instance.daemon.user_data, "launch_template_id = \"${aws_launch_template.worker.id}\"")
    error_message = "the daemon host must run provision run with a config naming the worker template"
  }

  assert {
    condition     = output.daemon_settings.subnets == { "us-east-1a" = "subnet-0123456789abcdef0", "use1-az1" = "subnet-0123456789abcdef0" }
    error_message = "the daemon must know the subnet of each zone, by name and by id"
  }

  assert {
    condition     = length(aws_launch_template.worker.instance_market_options) == 0
    error_message = "EC2 Fleet rejects launch templates with market options; the driver sets spot per launch"
  }

  assert {
    condition     = aws_launch_template.worker.metadata_options[0].http_tokens == "required" && aws_launch_template.worker.metadata_options[0].instance_metadata_tags == "enabled"
    error_message = "workers need IMDSv2 only, with tags readable (the driver passes env in tags)"
  }

  assert {
    condition     = aws_launch_template.worker.iam_instance_profile[0].arn == aws_iam_instance_profile.worker.arn
    error_message = "workers must get the worker profile, not the daemon's"
  }

  assert {
    condition     = aws_instance.daemon.metadata_options[0].http_tokens == "required" && aws_instance.daemon.metadata_options[0].http_put_response_hop_limit == 1 && aws_launch_template.worker.metadata_options[0].http_put_response_hop_limit == 1
    error_message = "the daemon host needs IMDSv2 only too, and no VM may hand its role credentials one hop further (a container)"
  }

  # The token value (the ring_token variable above) must appear in nothing the module writes:
  # user data is readable by anyone with ec2:DescribeInstanceAttribute, outputs by anyone with
  # the state.
  assert {
    condition     = !strcontains(aws_instance.daemon.user_data, "0123456789abcdef0123456789abcdef") && !strcontains(base64decode(aws_launch_template.worker.user_data), "0123456789abcdef0123456789abcdef")
    error_message = "the ring token must never be in user data (the VMs fetch it from SSM)"
  }

  assert {
    condition     = !strcontains(jsonencode(output.daemon_settings), "0123456789abcdef0123456789abcdef") && output.token_parameter == "/spotring/tftest/ring-token"
    error_message = "outputs may name the token's parameter, never hold the token"
  }

  # Nothing listens on all interfaces: the coordinator binds the host's private address, the
  # one workers dial, and the daemon's metrics stay off (no metrics_port).
  assert {
    condition     = output.daemon_settings.coordinator_host == aws_instance.daemon.private_ip && strcontains(aws_instance.daemon.user_data, "coordinator_host = \"10.0.1.10\"") && !strcontains(aws_instance.daemon.user_data, "0.0.0.0") && !strcontains(aws_instance.daemon.user_data, "metrics_port")
    error_message = "the coordinator must bind the daemon's private address, and nothing may listen on 0.0.0.0"
  }

  assert {
    condition     = alltrue([for b in aws_launch_template.worker.block_device_mappings : b.ebs[0].encrypted == "true"]) && aws_instance.daemon.root_block_device[0].encrypted
    error_message = "every volume must be encrypted"
  }

  assert {
    condition     = length(aws_cloudwatch_event_rule.notice) == 3 && alltrue([for k, t in aws_cloudwatch_event_target.notice : t.arn == aws_sqs_queue.notices.arn])
    error_message = "three notice rules must feed the queue"
  }

  assert {
    condition     = jsondecode(aws_cloudwatch_event_rule.notice["interruption"].event_pattern)["detail-type"] == ["EC2 Spot Instance Interruption Warning"]
    error_message = "the interruption rule must match the spot interruption warning"
  }

  assert {
    condition     = alltrue([for r in aws_security_group.ring.ingress : coalesce(r.self, false) && length(coalesce(r.cidr_blocks, [])) == 0 && length(coalesce(r.ipv6_cidr_blocks, [])) == 0])
    error_message = "ingress must come only from ring members"
  }

  assert {
    condition     = alltrue([for r in aws_security_group.ring.egress : coalesce(r.self, false) || (r.from_port == 443 && r.to_port == 443)])
    error_message = "egress outside the ring must be HTTPS only"
  }

  assert {
    condition     = toset([for r in aws_security_group.ring.ingress : r.from_port]) == toset([29500, 32768])
    error_message = "ingress must be exactly the coordinator port and the ring range"
  }

  assert {
    condition     = length(aws_security_group.ring.ingress) == 2 && alltrue([for r in aws_security_group.ring.ingress : r.protocol == "tcp" && length(coalesce(r.security_groups, [])) == 0 && length(coalesce(r.prefix_list_ids, [])) == 0])
    error_message = "the ring ports are open to the ring's own security group only (no other group, no prefix list)"
  }

  assert {
    condition     = aws_instance.daemon.vpc_security_group_ids == toset([aws_security_group.ring.id]) && aws_launch_template.worker.vpc_security_group_ids == toset([aws_security_group.ring.id])
    error_message = "the daemon and the workers must carry the ring group, and only it"
  }

  assert {
    condition = alltrue([
      for s in data.aws_iam_policy_document.daemon_api.statement :
      anytrue([for c in s.condition : c.variable == "ec2:ResourceTag/spotring:job" && toset(c.values) == toset(["tftest"])])
      if contains(s.actions, "ec2:TerminateInstances")
    ])
    error_message = "TerminateInstances must be limited to instances tagged with the job"
  }

  assert {
    condition = alltrue([
      for s in data.aws_iam_policy_document.daemon_api.statement :
      anytrue([for c in s.condition : c.variable == "aws:RequestTag/spotring:job" && toset(c.values) == toset(["tftest"])])
      if anytrue([for r in s.resources : endswith(r, ":instance/*")]) && contains(s.actions, "ec2:RunInstances")
    ])
    error_message = "instances may only be launched carrying the job tag"
  }

  assert {
    condition = alltrue([
      for s in data.aws_iam_policy_document.daemon_api.statement :
      length(s.condition) > 0 if contains(s.actions, "ec2:CreateTags") || contains(s.actions, "iam:PassRole")
    ])
    error_message = "CreateTags and PassRole must carry conditions"
  }

  assert {
    condition     = length([for s in data.aws_iam_policy_document.daemon_api.statement : s if contains(s.actions, "iam:PassRole")]) == 1
    error_message = "exactly one statement may pass a role"
  }

  assert {
    condition = length([
      for s in data.aws_iam_policy_document.daemon_api.statement : s
      if contains(s.actions, "ec2:TerminateInstances") || (contains(s.actions, "ec2:RunInstances") && anytrue([for r in s.resources : endswith(r, ":instance/*")]))
    ]) == 2
    error_message = "one statement each must grant launching and terminating job instances (so the checks above are not vacuous)"
  }
}

run "rejects_bad_inputs" {
  command = plan

  variables {
    job_id     = "Bad_Job"
    job_module = "train.py"
    subnet_ids = []
    ring_ports = { from = 40000, to = 30000 }
    ring_token = "short"
    # the index opt-in without a pinned version and hash (and beside a wheel: one or the other)
    spotring_index_requirement = "spotring[aws]"
  }

  expect_failures = [var.job_id, var.job_module, var.subnet_ids, var.ring_ports, var.ring_token, var.spotring_index_requirement]
}

run "index_opt_in_is_pinned_and_hashed" {
  command = plan

  variables {
    spotring_wheel             = null
    spotring_index_requirement = "spotring==0.1.0 --hash=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
  }

  assert {
    condition     = length(aws_s3_object.wheel) == 0 && strcontains(base64decode(aws_launch_template.worker.user_data), "index_requirement='spotring==0.1.0 --hash=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef'")
    error_message = "with the opt-in the workers install the pinned, hashed requirement"
  }
}

run "index_opt_in_refuses_a_bare_name" {
  command = plan

  variables {
    spotring_wheel             = null
    spotring_index_requirement = "spotring==0.1.0"
  }

  expect_failures = [var.spotring_index_requirement]
}
