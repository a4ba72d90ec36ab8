# spotring on GCP: per-job service accounts with the narrowest roles, the ring's own network
# (or an existing one) with firewall rules that admit the job's own VMs only, a SPOT GPU instance
# template and the daemon VM. Not validated here (no Google provider mirror): tests/terraform
# checks it with fmt, checkov, python-hcl2 and terraform itself on the provider-free files.

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
