# Names, firewall priorities and the daemon's IAM condition, derived from the inputs alone: no
# resource is referenced here, so tests/terraform evaluates this file with terraform and no
# Google provider (tests/terraform/test_gcp_module.py). Keep it that way.

locals {
  name        = "spotring-${var.job_id}"
  token_path  = "/etc/spotring/ring-token"
  state_path  = "/var/lib/spotring/state.sqlite"
  daemon_zone = var.zones[0]

  # The job's key: 8 hex digits of sha256(job_id). Fixed width on purpose: with the job id
  # itself in the prefix, job "a" (prefix "sr-a-") could touch job "a-b"'s VMs ("sr-a-b-...").
  job_key = substr(sha256(var.job_id), 0, 8)

  # Every worker VM (and its boot disk, named after it) is named "sr-<job key>-<launch hash>-<i>"
  # by provisioner/drivers/gcp.py (instance_prefix / instance_name); the daemon VM is not.
  instance_prefix = "sr-${local.job_key}-"

  # The daemon's Compute permissions are project-wide grants of a custom role; this condition
  # narrows those that act on one VM or one disk to this job's workers. Other jobs' workers,
  # other VMs of the project and the daemon VM itself are out of reach. Listing is not narrowed
  # (a list is authorised on the project, not per VM).
  daemon_iam_condition = join(" && ", [
    "(resource.type != 'compute.googleapis.com/Instance' || resource.name.extract('/instances/{name}').startsWith('${local.instance_prefix}'))",
    "(resource.type != 'compute.googleapis.com/Disk' || resource.name.extract('/disks/{name}').startsWith('${local.instance_prefix}'))",
  ])

  # Service accounts are per job (a firewall rule's source and target), named by the job key
  # (account ids are limited to 30 characters; the display name carries the job id).
  daemon_account_id = "sr-${local.job_key}-daemon"
  worker_account_id = "sr-${local.job_key}-worker"

  # Network: the module's own unless one is given. A given network or subnetwork by bare name is
  # made a project-relative path, which the daemon's Compute calls need.
  own_network = var.network == null
  given_network = local.own_network ? null : (
    strcontains(var.network, "/") ? var.network : "projects/${var.project}/global/networks/${var.network}"
  )
  given_subnetwork = local.own_network ? null : (
    strcontains(var.subnetwork, "/") ? var.subnetwork : "projects/${var.project}/regions/${var.region}/subnetworks/${var.subnetwork}"
  )

  # Firewall priorities (lower wins). The ring's allow rules come first; right after them a
  # deny of everything else to the job's VMs. It sits below 1000, the priority of a rule made
  # without one, so neither the pre-made rules of "default" (65534: any VM of the network on
  # every port, SSH and RDP from anywhere) nor an ordinary rule of the network reaches the
  # ring's VMs; only a rule deliberately given a priority below ring_deny_priority can.
  ring_allow_priority = 900
  ring_deny_priority  = 910
}
