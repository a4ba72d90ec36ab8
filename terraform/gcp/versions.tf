# spotring on GCP: service accounts with the narrowest roles, a SPOT GPU instance template, the
# ring firewall rules and the daemon VM. Not validated here (no Google provider mirror): fmt and
# checkov run in tests/terraform.

terraform {
  required_version = ">= 1.10"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.20, < 7.0"
    }
  }
}

provider "google" {
  project = var.project
  region  = var.region
}

locals {
  name        = "spotring-${var.job_id}"
  token_path  = "/etc/spotring/ring-token"
  daemon_zone = var.zones[0]
}
