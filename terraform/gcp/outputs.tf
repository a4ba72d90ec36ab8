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
  description = "Everything the daemon's config needs (also written onto the daemon VM); terraform/render_config.py turns it into TOML."
  value       = local.daemon_settings
}

output "network" {
  description = "The ring's VPC network ([gcp] network): the module's own unless one was given."
  value       = local.network_id
}

output "subnetwork" {
  description = "The ring's subnetwork ([gcp] subnetwork)."
  value       = local.subnetwork_id
}

output "instance_prefix" {
  description = "Name prefix of this job's worker VMs: the daemon's IAM condition reaches these only."
  value       = local.instance_prefix
}

output "token_secret" {
  description = "Secret Manager secret holding the ring token."
  value       = google_secret_manager_secret.ring_token.id
}
