variable "region" {
  description = "AWS region for every resource (the daemon's [aws] region)."
  type        = string
  default     = "us-east-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-gov)?-[a-z]+-[0-9]$", var.region))
    error_message = "region must look like us-east-1 or eu-west-2."
  }
}

variable "job_id" {
  description = "Training job id. Tags every resource and worker (spotring:job); the daemon's IAM policy only launches and terminates instances carrying it."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,62}$", var.job_id))
    error_message = "job_id must be 1-63 lowercase letters, digits or '-', starting with a letter or digit (the same rule as [job] id in the daemon config)."
  }
}

variable "job_module" {
  description = "What the workers train by default: a module name defining make_job, importable on the workers (`python -m trainer worker --job`; the daemon's [job] job_file, which a launch overrides with SPOTRING_JOB). A .py path is not accepted on a cloud."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)*$", var.job_module)) && !endswith(var.job_module, ".py")
    error_message = "job_module must be a module name such as spotring_examples.digits (letters, digits and '_', dotted), not a .py path: the daemon and the workers import it."
  }
}

variable "vpc_id" {
  description = "VPC for the daemon host and the workers."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]{8,17}$", var.vpc_id))
    error_message = "vpc_id must be a VPC id such as vpc-0123456789abcdef0."
  }
}

variable "subnet_ids" {
  description = "Subnets (of vpc_id) where workers may launch; the daemon host uses the first. They need an outbound route (NAT gateway or VPC endpoints) for pip and the AWS APIs."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) > 0 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]{8,17}$", s))])
    error_message = "subnet_ids must hold at least one subnet id such as subnet-0123456789abcdef0."
  }
}

variable "worker_ami_id" {
  description = "AMI for GPU workers: NVIDIA drivers, the AWS CLI, and a Python >= 3.11 with PyTorch (worker_python); docs/deploy.md names tested images."
  type        = string

  validation {
    condition     = can(regex("^ami-[0-9a-f]{8,17}$", var.worker_ami_id))
    error_message = "worker_ami_id must be an AMI id such as ami-0123456789abcdef0."
  }
}

variable "worker_instance_type" {
  description = "Default instance type in the worker launch template; the daemon overrides it per launch with the offering the optimiser chose."
  type        = string
  default     = "g5.xlarge"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.worker_instance_type))
    error_message = "worker_instance_type must be an EC2 instance type such as g5.xlarge."
  }
}

variable "worker_volume_gb" {
  description = "Root volume size of a worker in GiB (encrypted gp3)."
  type        = number
  default     = 100

  validation {
    condition     = var.worker_volume_gb >= 30 && var.worker_volume_gb <= 2000 && floor(var.worker_volume_gb) == var.worker_volume_gb
    error_message = "worker_volume_gb must be a whole number from 30 to 2000."
  }
}

variable "worker_extra_args" {
  description = "Extra arguments appended to `python -m trainer worker` on every worker (e.g. the job module)."
  type        = string
  default     = ""

  validation {
    condition     = !can(regex("['\\n\\\\$`]", var.worker_extra_args))
    error_message = "worker_extra_args must not contain quotes, backslashes, '$', backticks or newlines (it is placed in a systemd unit)."
  }
}

variable "daemon_ami_id" {
  description = "AMI for the daemon host (needs python3 >= 3.11 and the AWS CLI). Null uses the latest Amazon Linux 2023 from the public SSM parameter."
  type        = string
  default     = null

  validation {
    condition     = var.daemon_ami_id == null || can(regex("^ami-[0-9a-f]{8,17}$", coalesce(var.daemon_ami_id, "x")))
    error_message = "daemon_ami_id must be null or an AMI id such as ami-0123456789abcdef0."
  }
}

variable "daemon_instance_type" {
  description = "Instance type of the daemon host (on-demand; runs the provisioner and the ring coordinator, no GPU)."
  type        = string
  default     = "t3.small"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.daemon_instance_type))
    error_message = "daemon_instance_type must be an EC2 instance type such as t3.small."
  }
}

variable "coordinator_port" {
  description = "TCP port of the ring coordinator (the torch TCPStore inside the daemon)."
  type        = number
  default     = 29500

  validation {
    condition     = var.coordinator_port >= 1024 && var.coordinator_port <= 65535
    error_message = "coordinator_port must be from 1024 to 65535."
  }
}

variable "ring_ports" {
  description = "TCP port range the workers use to reach each other (gloo/NCCL pick ephemeral ports, so the default is Linux's ephemeral range)."
  type = object({
    from = number
    to   = number
  })
  default = {
    from = 32768
    to   = 60999
  }

  validation {
    condition     = var.ring_ports.from >= 1024 && var.ring_ports.to <= 65535 && var.ring_ports.from <= var.ring_ports.to
    error_message = "ring_ports must satisfy 1024 <= from <= to <= 65535."
  }
}

variable "ring_token" {
  description = "Shared secret workers present to the coordinator. Ephemeral and write-only: stored in an SSM SecureString, never in the Terraform state. Generate with `openssl rand -hex 32`."
  type        = string
  sensitive   = true
  ephemeral   = true

  validation {
    condition     = length(var.ring_token) >= 32
    error_message = "ring_token must be at least 32 characters (e.g. `openssl rand -hex 32`)."
  }
}

variable "ring_token_version" {
  description = "Bump to write a new ring_token into SSM (write-only values are only sent when this changes)."
  type        = number
  default     = 1

  validation {
    condition     = var.ring_token_version >= 1 && floor(var.ring_token_version) == var.ring_token_version
    error_message = "ring_token_version must be a whole number >= 1."
  }
}

variable "spotring_wheel" {
  description = "Path of the spotring wheel to deploy (`pip wheel --no-deps -w dist .`). Terraform uploads it to the artifacts bucket; the daemon host and the workers install it pinned by its SHA-256 (nothing of spotring comes from a package index). Null only with spotring_index_requirement."
  type        = string
  default     = null

  validation {
    condition     = var.spotring_wheel == null || can(regex("^[^'\n\\\\$`]*spotring-[0-9][^/]*\\.whl$", coalesce(var.spotring_wheel, "x")))
    error_message = "spotring_wheel must be the path of a spotring-<version>-...whl file (no quotes, backslashes, '$', backticks or newlines)."
  }
}

variable "spotring_index_requirement" {
  description = "Opt-in: install spotring from a package index instead of a wheel, as a pinned and hashed pip requirement (`spotring==0.1.0 --hash=sha256:<64 hex>`). Null (default): the wheel of spotring_wheel."
  type        = string
  default     = null

  validation {
    condition     = var.spotring_index_requirement == null || can(regex("^spotring(\\[[a-z,]+\\])?==[0-9][0-9A-Za-z.+!-]*( --hash=sha256:[0-9a-f]{64})+$", coalesce(var.spotring_index_requirement, "x")))
    error_message = "spotring_index_requirement must pin a version and its hash: spotring==<version> --hash=sha256:<64 hex digits> (one or more hashes); an unpinned name could install anyone's package as root."
  }

  validation {
    condition     = (var.spotring_index_requirement == null) != (var.spotring_wheel == null)
    error_message = "set exactly one of spotring_wheel (the default way: the wheel you built) and spotring_index_requirement (the opt-in)."
  }
}

variable "worker_python" {
  description = "The worker image's Python (>= 3.11) that has PyTorch; the workers' venv sees its packages (e.g. /opt/conda/bin/python3 on a Deep Learning AMI with conda)."
  type        = string
  default     = "python3"

  validation {
    condition     = can(regex("^[A-Za-z0-9_./-]+$", var.worker_python))
    error_message = "worker_python must be a command or path made of letters, digits, '_', '.', '/' and '-'."
  }
}

variable "price_regions" {
  description = "Regions whose spot prices the daemon watches (the [source] regions); empty means the deploy region only."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for r in var.price_regions : can(regex("^[a-z]{2}(-gov)?-[a-z]+-[0-9]$", r))])
    error_message = "price_regions must be region names such as us-east-1."
  }
}

variable "max_workers" {
  description = "Largest number of workers the daemon may run at once (the [fleet] max_size)."
  type        = number
  default     = 8

  validation {
    condition     = var.max_workers >= 1 && var.max_workers <= 1000 && floor(var.max_workers) == var.max_workers
    error_message = "max_workers must be a whole number from 1 to 1000."
  }
}

variable "notice_retention_seconds" {
  description = "How long an undelivered spot notice stays in the queue (a 2-minute warning is useless after that; state changes help a restarted daemon)."
  type        = number
  default     = 3600

  validation {
    condition     = var.notice_retention_seconds >= 60 && var.notice_retention_seconds <= 1209600
    error_message = "notice_retention_seconds must be from 60 to 1209600 (SQS limits)."
  }
}

variable "tags" {
  description = "Extra tags for every resource (spotring:job is always added)."
  type        = map(string)
  default     = {}
}

variable "daemon_detailed_monitoring" {
  description = "1-minute CloudWatch metrics for the daemon host (turn off only for emulators that lack MonitorInstances)."
  type        = bool
  default     = true
}

variable "daemon_host_number" {
  description = "Host number of the daemon's fixed private address inside the first subnet (cidrhost); it must be free. AWS reserves the first four and the last address."
  type        = number
  default     = 10

  validation {
    condition     = var.daemon_host_number >= 4 && var.daemon_host_number <= 250 && floor(var.daemon_host_number) == var.daemon_host_number
    error_message = "daemon_host_number must be a whole number from 4 to 250."
  }
}
