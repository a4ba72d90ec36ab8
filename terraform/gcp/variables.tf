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
  description = "What the workers train: a module name or .py path defining make_job (`python -m trainer worker --job`)."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_./-]+$", var.job_module))
    error_message = "job_module must be made of letters, digits, '_', '.', '/' and '-'."
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
  description = "Boot image of the workers: NVIDIA drivers and python3 >= 3.11 (e.g. a Deep Learning VM image)."
  type        = string
  default     = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11-py310"
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

variable "spotring_package" {
  description = "pip requirement that installs spotring on the VMs."
  type        = string
  default     = "spotring[gcp]" # the Google SDKs are an extra: the daemon and gs:// snapshots need them

  validation {
    condition     = length(var.spotring_package) > 0 && !can(regex("['\\n\\\\$`]", var.spotring_package))
    error_message = "spotring_package must be a non-empty pip requirement without quotes, backslashes, '$', backticks or newlines."
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
