# --- identities: the narrowest grants, per job ------------------------------------------------
# The daemon gets a custom role with exactly the Compute permissions the GCP driver and price
# source use (insert/delete/list SPOT VMs, read preemption operations, list zones, machine and
# accelerator types), narrowed by an IAM condition to this job's workers (naming.tf), may act
# as this job's worker service account only, and reads the ring token. Workers can read the
# ring token and nothing else. Both accounts are this job's own: the firewall rules
# (network.tf) admit VMs by them.

resource "google_service_account" "daemon" {
  account_id   = local.daemon_account_id
  display_name = "spotring ${var.job_id} daemon"
  description  = "Runs the spotring daemon and ring coordinator of job ${var.job_id}"
}

resource "google_service_account" "worker" {
  account_id   = local.worker_account_id
  display_name = "spotring ${var.job_id} GPU worker"
  description  = "Identity of job ${var.job_id}'s SPOT workers: the ring's firewall rules admit it"
}

resource "google_project_iam_custom_role" "daemon" {
  role_id     = replace("spotring_${var.job_id}_daemon", "-", "_")
  title       = "spotring ${var.job_id} daemon"
  description = "Launch, list and delete the job's SPOT workers; read preemptions and the catalog."
  permissions = [
    "compute.acceleratorTypes.list",
    "compute.disks.create",
    "compute.images.useReadOnly",
    "compute.instances.create",
    "compute.instances.delete",
    "compute.instances.get",
    "compute.instances.list",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setServiceAccount",
    "compute.machineTypes.list",
    "compute.subnetworks.use",
    "compute.zoneOperations.get",
    "compute.zoneOperations.list",
    "compute.zones.list",
  ]
}

resource "google_project_iam_member" "daemon" {
  project = var.project
  role    = google_project_iam_custom_role.daemon.id
  member  = "serviceAccount:${google_service_account.daemon.email}"

  # Per job: VM and disk permissions reach only the names this job's driver gives its workers
  # (sr-<job key>-...), never another job's workers, other VMs or the daemon VM.
  condition {
    title       = "only-job-${local.job_key}-workers"
    description = "VM and disk permissions apply only to job ${var.job_id}'s workers (named ${local.instance_prefix}<launch>-<n>)."
    expression  = local.daemon_iam_condition
  }
}

resource "google_service_account_iam_member" "daemon_acts_as_worker" {
  service_account_id = google_service_account.worker.name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.daemon.email}"
}

# --- the ring token ---------------------------------------------------------------------------

resource "google_secret_manager_secret" "ring_token" {
  secret_id = "${local.name}-ring-token"

  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_version" "ring_token" {
  secret                 = google_secret_manager_secret.ring_token.id
  secret_data_wo         = var.ring_token
  secret_data_wo_version = var.ring_token_version
}

resource "google_secret_manager_secret_iam_member" "token_readers" {
  for_each = {
    daemon = google_service_account.daemon.email
    worker = google_service_account.worker.email
  }

  secret_id = google_secret_manager_secret.ring_token.id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${each.value}"
}

# --- the GPU SPOT worker template -------------------------------------------------------------

locals {
  # Workers dial the address the coordinator binds: the daemon's private address.
  coordinator_address = "${google_compute_address.daemon.address}:${var.coordinator_port}"

  worker_startup = templatefile("${path.module}/templates/worker-startup.sh.tftpl", {
    secret            = google_secret_manager_secret.ring_token.secret_id
    project           = var.project
    coordinator       = local.coordinator_address
    token_path        = local.token_path
    job_module        = var.job_module
    extra_args        = var.worker_extra_args
    python            = var.worker_python
    artifacts         = local.artifacts_url
    wheel_url         = local.wheel_url
    wheel_sha256      = local.wheel_sha256
    index_requirement = var.spotring_index_requirement == null ? "" : var.spotring_index_requirement
  })
}

resource "google_compute_instance_template" "worker" {
  name_prefix  = "${local.name}-worker-"
  description  = "spotring ${var.job_id} GPU SPOT worker"
  machine_type = var.worker_machine_type

  labels = {
    spotring-job = var.job_id
  }

  disk {
    source_image = var.worker_image
    disk_size_gb = var.worker_disk_gb
    disk_type    = "pd-balanced"
    auto_delete  = true
    boot         = true
  }

  dynamic "guest_accelerator" {
    for_each = var.worker_gpu.count > 0 ? [var.worker_gpu] : []
    content {
      type  = guest_accelerator.value.type
      count = guest_accelerator.value.count
    }
  }

  scheduling {
    provisioning_model          = "SPOT"
    preemptible                 = true
    automatic_restart           = false
    on_host_maintenance         = "TERMINATE"
    instance_termination_action = "DELETE"
  }

  # No access_config: no public address (Cloud NAT and Private Google Access reach out).
  network_interface {
    subnetwork = local.subnetwork_id
  }

  service_account {
    email  = google_service_account.worker.email
    scopes = ["cloud-platform"]
  }

  shielded_instance_config {
    enable_secure_boot          = true
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  metadata = {
    block-project-ssh-keys = "true"
    enable-oslogin         = "TRUE"
    startup-script         = local.worker_startup
  }

  lifecycle {
    create_before_destroy = true
  }
}

# --- the daemon VM ----------------------------------------------------------------------------

resource "google_compute_address" "daemon" {
  name         = "${local.name}-daemon"
  address_type = "INTERNAL"
  subnetwork   = local.subnetwork_id
  region       = var.region
}

locals {
  # What `provision run` needs; outputs.tf exposes the same map and terraform/render_config.py
  # turns `terraform output -json` into the same TOML. No secret: the token stays in Secret
  # Manager, and the daemon reads it from token_path.
  daemon_settings = {
    cloud           = "gcp"
    job_id          = var.job_id
    job_file        = var.job_module
    max_workers     = var.max_workers
    project         = var.project
    zones           = var.zones
    network         = local.network_id
    subnetwork      = local.subnetwork_id
    source_image    = var.worker_image
    boot_disk_gb    = var.worker_disk_gb
    service_account = google_service_account.worker.email
    startup_script  = local.worker_startup
    # The coordinator listens on the daemon's private address only (not 0.0.0.0); the firewall
    # admits the job's workers to it. No metrics port: the daemon's metrics stay off (or on
    # loopback when asked for on the command line).
    coordinator_host = google_compute_address.daemon.address
    coordinator_port = var.coordinator_port
    token_path       = local.token_path
    state_path       = local.state_path
    # The run's artifacts: the daemon stores the wheel it runs there and pins it on every
    # launch; `wheel` is where the daemon VM keeps that wheel ("" with the index opt-in).
    artifacts = var.spotring_wheel == null ? "" : local.artifacts_url
    wheel     = var.spotring_wheel == null ? "" : "/opt/spotring-dist/${basename(var.spotring_wheel)}"
    # The ring's snapshots (snapshots.tf): the workers may create there while the daemon is away
    snapshot_url = local.snapshot_url
  }
}

resource "google_compute_instance" "daemon" {
  #checkov:skip=CKV_GCP_38:Customer-supplied keys must be sent with every start of the VM, which an unattended daemon cannot do; the boot disk holds no secret beyond the ring token (Google-managed encryption at rest applies).
  name         = "${local.name}-daemon"
  zone         = local.daemon_zone
  machine_type = var.daemon_machine_type

  labels = {
    spotring-job = var.job_id
  }

  boot_disk {
    initialize_params {
      image = var.daemon_image
      size  = 20
    }
  }

  # The coordinator binds this private address (daemon_settings.coordinator_host), never
  # 0.0.0.0; no access_config, so no public address.
  network_interface {
    subnetwork = local.subnetwork_id
    network_ip = google_compute_address.daemon.address
  }

  service_account {
    email  = google_service_account.daemon.email
    scopes = ["cloud-platform"]
  }

  shielded_instance_config {
    enable_secure_boot          = true
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  metadata = {
    block-project-ssh-keys = "true"
    enable-oslogin         = "TRUE"
    startup-script = templatefile("${path.module}/templates/daemon-startup.sh.tftpl", {
      secret            = google_secret_manager_secret.ring_token.secret_id
      project           = var.project
      token_path        = local.token_path
      wheel_url         = local.wheel_url
      wheel_sha256      = local.wheel_sha256
      wheel_path        = local.daemon_settings.wheel
      index_requirement = var.spotring_index_requirement == null ? "" : var.spotring_index_requirement
      config_toml       = templatefile("${path.module}/templates/daemon-config.toml.tftpl", local.daemon_settings)
    })
  }
}
