variable "project" {
  description = "GCP project id (the daemon's [gcp] project)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a GCP project id: 6-30 lowercase letters, digits or '-', starting with a letter."
  }
}

variable "region" {
  description = "Region of the subnetwork, the daemon VM and the workers."
  type        = string
  default     = "us-central1"

  validation {
    condition     = can(regex("^[a-z]+-[a-z]+[0-9]$", var.region))
    error_message = "region must look like us-central1."
  }
}

variable "zones" {
  description = "Zones (of region) the daemon may launch SPOT workers in (and watches for preemptions); the daemon VM uses the first."
  type        = list(string)

  validation {
    condition     = length(var.zones) > 0 && alltrue([for z in var.zones : can(regex("^[a-z]+-[a-z]+[0-9]-[a-z]$", z))])
    error_message = "zones must hold at least one zone such as us-central1-a."
  }

  # One subnetwork holds the ring, and a subnetwork is regional.
  validation {
    condition     = alltrue([for z in var.zones : startswith(z, "${var.region}-")])
    error_message = "zones must all be zones of region (the ring's subnetwork is regional)."
  }
}

variable "job_id" {
  description = "Training job id; labels every VM (spotring-job) and names the resources."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,40}$", var.job_id))
    error_message = "job_id must be 1-41 lowercase letters, digits or '-' (GCP names are limited to 63 characters)."
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

variable "network" {
  description = "Existing VPC network (name or self link) to put the ring in. Null (the default): the module makes its own network, subnetwork, Cloud Router and Cloud NAT, so no other VM of the project shares the ring's network. An existing network keeps its own firewall rules; see docs/deploy.md for what the pre-made rules of \"default\" allow."
  type        = string
  default     = null

  validation {
    condition     = var.network == null || can(regex("^([a-z]([-a-z0-9]{0,61}[a-z0-9])?|(https://www\\.googleapis\\.com/compute/v1/)?(projects/[^/]+/)?global/networks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?)$", coalesce(var.network, "x")))
    error_message = "network must be null, a network name or a network self link (projects/P/global/networks/N)."
  }
}

variable "subnetwork" {
  description = "Subnetwork (of network, in region) for the daemon VM and the workers, when network is given; it needs Cloud NAT (pip) and Private Google Access (the APIs): no VM gets a public address. Null when the module makes its own network."
  type        = string
  default     = null

  validation {
    condition     = (var.subnetwork == null) == (var.network == null)
    error_message = "subnetwork must be given with network, and only with it (null: the module makes both)."
  }

  validation {
    condition     = var.subnetwork == null || can(regex("^([a-z]([-a-z0-9]{0,61}[a-z0-9])?|(https://www\\.googleapis\\.com/compute/v1/)?(projects/[^/]+/)?regions/[a-z]+-[a-z]+[0-9]/subnetworks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?)$", coalesce(var.subnetwork, "x")))
    error_message = "subnetwork must be null, a subnetwork name or a subnetwork self link (projects/P/regions/R/subnetworks/N)."
  }
}

variable "subnet_cidr" {
  description = "IPv4 range of the subnetwork the module makes (when network is null); it must not overlap networks you peer with it."
  type        = string
  default     = "10.64.0.0/20"

  validation {
    condition     = can(regex("^[0-9.]+/(1[6-9]|2[0-4])$", var.subnet_cidr)) && try(cidrhost(var.subnet_cidr, 0) == split("/", var.subnet_cidr)[0], false)
    error_message = "subnet_cidr must be an IPv4 CIDR block from /16 to /24 given by its first address, such as 10.64.0.0/20."
  }
}

variable "worker_machine_type" {
  description = "Default machine type of the worker template; the daemon picks the offering per launch."
  type        = string
  default     = "n1-standard-8"

  validation {
    condition     = can(regex("^[a-z0-9]+-[a-z0-9-]+$", var.worker_machine_type))
    error_message = "worker_machine_type must be a machine type such as n1-standard-8 or a2-highgpu-1g."
  }
}

variable "worker_gpu" {
  description = "GPUs attached to each worker (type and count); a2/a3/g2 machine types bundle their GPUs, use count = 0 for them."
  type = object({
    type  = string
    count = number
  })
  default = {
    type  = "nvidia-tesla-t4"
    count = 1
  }

  validation {
    condition     = can(regex("^nvidia-[a-z0-9-]+$", var.worker_gpu.type)) && contains([0, 1, 2, 4, 8], var.worker_gpu.count)
    error_message = "worker_gpu.type must be an accelerator type such as nvidia-tesla-t4 and count one of 0, 1, 2, 4, 8."
  }
}

variable "worker_image" {
  description = "Boot image of the workers: NVIDIA drivers, gcloud, and a Python >= 3.11 with PyTorch (worker_python). No default: the Deep Learning VM families this module named before ship Python 3.10, which the workers refuse (exit 10); docs/deploy.md says what was tested."
  type        = string

  validation {
    condition     = can(regex("^(projects/[a-z][-a-z0-9]*[a-z0-9]/global/images/(family/)?[a-z][-a-z0-9]*|https://www\\.googleapis\\.com/compute/v1/projects/.+)$", var.worker_image))
    error_message = "worker_image must be an image or image family path such as projects/my-project/global/images/family/spotring-worker."
  }
}

variable "worker_disk_gb" {
  description = "Boot disk of a worker in GB."
  type        = number
  default     = 100

  validation {
    condition     = var.worker_disk_gb >= 50 && var.worker_disk_gb <= 2000
    error_message = "worker_disk_gb must be from 50 to 2000."
  }
}

variable "daemon_machine_type" {
  description = "Machine type of the daemon VM (on-demand, no GPU)."
  type        = string
  default     = "e2-small"
}

variable "daemon_image" {
  description = "Boot image of the daemon VM (python3 >= 3.11)."
  type        = string
  default     = "projects/debian-cloud/global/images/family/debian-12"
}

variable "coordinator_port" {
  description = "TCP port of the ring coordinator inside the daemon."
  type        = number
  default     = 29500

  validation {
    condition     = var.coordinator_port >= 1024 && var.coordinator_port <= 65535
    error_message = "coordinator_port must be from 1024 to 65535."
  }
}

variable "ring_ports" {
  description = "TCP port range workers use to reach each other (gloo/NCCL use ephemeral ports)."
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
  description = "Shared secret of the ring, stored write-only in Secret Manager (never in state). Generate with `openssl rand -hex 32`."
  type        = string
  sensitive   = true
  ephemeral   = true

  validation {
    condition     = length(var.ring_token) >= 32
    error_message = "ring_token must be at least 32 characters."
  }
}

variable "ring_token_version" {
  description = "Bump to store a new ring_token."
  type        = number
  default     = 1
}

variable "spotring_wheel" {
  description = "Path of the spotring wheel to deploy (`pip wheel --no-deps -w dist .`). Terraform uploads it to the artifacts bucket; the daemon VM and the workers install it pinned by its SHA-256 (nothing of spotring comes from a package index). Null only with spotring_index_requirement."
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
  description = "The worker image's Python (>= 3.11) that has PyTorch; the workers' venv sees its packages (e.g. /opt/conda/bin/python3 on a Deep Learning VM image)."
  type        = string
  default     = "python3"

  validation {
    condition     = can(regex("^[A-Za-z0-9_./-]+$", var.worker_python))
    error_message = "worker_python must be a command or path made of letters, digits, '_', '.', '/' and '-'."
  }
}

variable "worker_extra_args" {
  description = "Extra arguments appended to `python -m trainer worker` on every worker."
  type        = string
  default     = ""

  validation {
    condition     = !can(regex("['\n\\\\$`]", var.worker_extra_args))
    error_message = "worker_extra_args must not contain quotes, backslashes, '$', backticks or newlines (it is placed in a systemd unit)."
  }
}

variable "max_workers" {
  description = "Largest number of workers at once ([fleet] max_size)."
  type        = number
  default     = 8

  validation {
    condition     = var.max_workers >= 1 && var.max_workers <= 1000
    error_message = "max_workers must be from 1 to 1000."
  }
}
