output "daemon_service_account" {
  description = "Service account of the daemon VM."
  value       = google_service_account.daemon.email
}

output "worker_service_account" {
  description = "Service account of the workers ([gcp] service_account)."
  value       = google_service_account.worker.email
}

output "worker_instance_template" {
  description = "SPOT GPU worker instance template."
  value       = google_compute_instance_template.worker.self_link
}

output "coordinator_address" {
  description = "host:port of the ring coordinator on the daemon VM."
  value       = local.coordinator_address
}

output "daemon_settings" {
  description = "What the daemon's config holds (also written onto the daemon VM)."
  value = {
    project          = var.project
    zones            = var.zones
    network          = var.network
    service_account  = google_service_account.worker.email
    coordinator_host = google_compute_address.daemon.address
    coordinator_port = var.coordinator_port
  }
}

output "token_secret" {
  description = "Secret Manager secret holding the ring token."
  value       = google_secret_manager_secret.ring_token.id
}
