# --- identities: the narrowest grants ---------------------------------------------------------
# The daemon gets a custom role with exactly the Compute permissions the GCP driver and price
# source use (insert/delete/list SPOT VMs, read preemption operations, list zones, machine and
# accelerator types), may act as the worker service account only, and reads the ring token.
# Workers can read the ring token and nothing else.

resource "google_service_account" "daemon" {
  account_id   = "${local.name}-daemon"
  display_name = "spotring ${var.job_id} daemon"
}

resource "google_service_account" "worker" {
  account_id   = "${local.name}-worker"
  display_name = "spotring ${var.job_id} GPU worker"
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

  condition {
    title       = "only-spotring-instances"
    description = "Instance permissions apply only to VMs named like the driver names them (sr-<hash>-<n>)."
    expression  = "resource.type != 'compute.googleapis.com/Instance' || resource.name.extract('/instances/{name}').startsWith('sr-')"
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

# --- network: the ring only -------------------------------------------------------------------

resource "google_compute_firewall" "ring" {
  name        = "${local.name}-ring"
  network     = var.network
  description = "spotring ${var.job_id}: ring members reach the coordinator and each other"
  direction   = "INGRESS"
  priority    = 1000

  # Service accounts, not network tags: the driver sets no tags, and a tag can be put on any
  # VM by anyone who may edit it; the accounts are the ring's identities.
  source_service_accounts = [google_service_account.daemon.email, google_service_account.worker.email]
  target_service_accounts = [google_service_account.daemon.email, google_service_account.worker.email]

  allow {
    protocol = "tcp"
    ports    = [tostring(var.coordinator_port), "${var.ring_ports.from}-${var.ring_ports.to}"]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}

# --- the GPU SPOT worker template -------------------------------------------------------------

locals {
  coordinator_address = "${google_compute_address.daemon.address}:${var.coordinator_port}"

  worker_startup = templatefile("${path.module}/templates/worker-startup.sh.tftpl", {
    secret           = google_secret_manager_secret.ring_token.secret_id
    project          = var.project
    coordinator      = local.coordinator_address
    token_path       = local.token_path
    spotring_package = var.spotring_package
    job_module       = var.job_module
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

  network_interface {
    subnetwork = var.subnetwork
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
  subnetwork   = var.subnetwork
  region       = var.region
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

  network_interface {
    subnetwork = var.subnetwork
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
      secret           = google_secret_manager_secret.ring_token.secret_id
      project          = var.project
      token_path       = local.token_path
      spotring_package = var.spotring_package
      config_toml = templatefile("${path.module}/templates/daemon-config.toml.tftpl", {
        job_id           = var.job_id
        job_module       = var.job_module
        max_workers      = var.max_workers
        project          = var.project
        zones            = var.zones
        network          = var.network
        worker_image     = var.worker_image
        worker_disk_gb   = var.worker_disk_gb
        service_account  = google_service_account.worker.email
        startup_script   = local.worker_startup
        coordinator_host = google_compute_address.daemon.address
        coordinator_port = var.coordinator_port
        token_path       = local.token_path
      })
    })
  }
}
