# The ring's network. By default the module makes its own VPC network with one subnetwork, so no
# other VM of the project shares it: the pre-made rules of the "default" network (any VM of the
# network reaches any port of any other) cannot let a stranger reach the ring's ports. No VM gets
# a public address: Cloud NAT carries pip and apt, Private Google Access the Google APIs
# (Secret Manager, Compute).
#
# Firewall rules name the job's own service accounts as sources and targets, not network tags:
# anyone who may edit a VM may put a tag on it, while running a VM as the worker account needs
# iam.serviceAccounts.actAs on it, granted here to this job's daemon only.
#
# What no rule can give: the gloo/NCCL data connections between workers are not authenticated
# by the ring token; only these rules keep strangers off them (docs/deploy.md).

resource "google_compute_network" "ring" {
  count = local.own_network ? 1 : 0

  name                    = local.name
  description             = "spotring ${var.job_id}: the ring's own network (daemon and workers only)"
  auto_create_subnetworks = false
  routing_mode            = "REGIONAL"
}

resource "google_compute_subnetwork" "ring" {
  count = local.own_network ? 1 : 0

  name          = local.name
  description   = "spotring ${var.job_id}: daemon and SPOT workers"
  region        = var.region
  network       = google_compute_network.ring[0].id
  ip_cidr_range = var.subnet_cidr
  stack_type    = "IPV4_ONLY"

  # The VMs have no public address: Secret Manager and the Compute API through Google's
  # private access, not through the NAT.
  private_ip_google_access = true

  # Flow logs: who talked to the ring's VMs, for an after-the-fact look.
  log_config {
    aggregation_interval = "INTERVAL_5_MIN"
    flow_sampling        = 0.5
    metadata             = "INCLUDE_ALL_METADATA"
  }
}

resource "google_compute_router" "ring" {
  count = local.own_network ? 1 : 0

  name        = "${local.name}-router"
  description = "spotring ${var.job_id}: Cloud NAT of the ring's subnetwork"
  region      = var.region
  network     = google_compute_network.ring[0].id
}

# Outbound only (pip, apt, PyPI): NAT admits no connection from outside.
resource "google_compute_router_nat" "ring" {
  count = local.own_network ? 1 : 0

  name                               = "${local.name}-nat"
  router                             = google_compute_router.ring[0].name
  region                             = var.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "LIST_OF_SUBNETWORKS"

  subnetwork {
    name                    = google_compute_subnetwork.ring[0].id
    source_ip_ranges_to_nat = ["ALL_IP_RANGES"]
  }

  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
}

locals {
  # Project-relative paths ("projects/P/global/networks/N", ".../regions/R/subnetworks/N"): what
  # the VMs, the firewall rules and the daemon's config ([gcp] network, subnetwork) name.
  network_id    = local.own_network ? google_compute_network.ring[0].id : local.given_network
  subnetwork_id = local.own_network ? google_compute_subnetwork.ring[0].id : local.given_subnetwork
}

# --- firewall: the ring only ------------------------------------------------------------------
#
# Each rule names its network by the expression of local.network_id written out: checkov's graph
# does not follow locals, and would not see the module's network guarded by these rules
# (CKV2_GCP_18).

# Workers dial the coordinator inside the daemon (its control channel, authenticated with the
# ring token). Nothing else reaches the daemon.
resource "google_compute_firewall" "coordinator" {
  name        = "${local.name}-coord"
  network     = local.own_network ? google_compute_network.ring[0].id : local.given_network
  description = "spotring ${var.job_id}: the job's workers to the ring coordinator on the daemon"
  direction   = "INGRESS"
  priority    = local.ring_allow_priority

  source_service_accounts = [google_service_account.worker.email]
  target_service_accounts = [google_service_account.daemon.email]

  allow {
    protocol = "tcp"
    ports    = [tostring(var.coordinator_port)]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}

# Workers reach each other on the ring's data ports (gloo/NCCL pick ephemeral ports). These
# connections carry gradients and the training state and are not authenticated by the token:
# this rule is what keeps everyone else off them.
resource "google_compute_firewall" "peers" {
  name        = "${local.name}-peers"
  network     = local.own_network ? google_compute_network.ring[0].id : local.given_network
  description = "spotring ${var.job_id}: the job's workers to each other (gloo/NCCL)"
  direction   = "INGRESS"
  priority    = local.ring_allow_priority

  source_service_accounts = [google_service_account.worker.email]
  target_service_accounts = [google_service_account.worker.email]

  allow {
    protocol = "tcp"
    ports    = ["${var.ring_ports.from}-${var.ring_ports.to}"]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}

# Everything else to the job's VMs is refused, before any ordinary rule of the network is
# looked at (naming.tf: ring_deny_priority). In the module's own network this only restates the
# implied deny; in an existing network it overrides "default"'s default-allow-internal,
# default-allow-ssh and default-allow-rdp, and any rule left at priority 1000.
resource "google_compute_firewall" "deny_rest" {
  name        = "${local.name}-deny"
  network     = local.own_network ? google_compute_network.ring[0].id : local.given_network
  description = "spotring ${var.job_id}: nothing but the ring reaches the job's VMs"
  direction   = "INGRESS"
  priority    = local.ring_deny_priority

  source_ranges           = ["0.0.0.0/0"]
  target_service_accounts = [google_service_account.daemon.email, google_service_account.worker.email]

  deny {
    protocol = "all"
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}
