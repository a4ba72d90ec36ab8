# The run's artifacts: a private bucket holding the spotring wheel the daemon and the workers
# install, content-addressed (artifacts/<sha256>/<file>). Terraform uploads var.spotring_wheel
# there; the daemon VM installs it, pinned by that SHA-256, and ships the same file with every
# launch ([cloud] artifacts, provisioner/drivers/artifacts.py). Nothing is installed by name from
# a package index unless var.spotring_index_requirement (pinned and hashed) asks for it.

locals {
  artifacts_prefix = "artifacts"
  artifacts_url    = "gs://${google_storage_bucket.artifacts.name}/${local.artifacts_prefix}/"
  wheel_sha256     = var.spotring_wheel == null ? "" : filesha256(var.spotring_wheel)
  wheel_object     = var.spotring_wheel == null ? "" : "${local.artifacts_prefix}/${local.wheel_sha256}/${basename(var.spotring_wheel)}"
  wheel_url        = var.spotring_wheel == null ? "" : "gs://${google_storage_bucket.artifacts.name}/${local.wheel_object}"
}

resource "google_storage_bucket" "artifacts" {
  #checkov:skip=CKV_GCP_62:Access logs of a bucket read only by this job's two service accounts would need a second bucket for no added control; Cloud Audit Logs data access covers it when the project wants them.
  name                        = "${local.name}-artifacts-${substr(sha256(var.project), 0, 6)}"
  location                    = var.region
  force_destroy               = true # only content-addressed copies of a wheel the user keeps
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"

  versioning {
    enabled = true
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 30
    }
    action {
      type = "Delete"
    }
  }

  # snapshots (snapshots.tf) are large and replaced every interval: the ones the coordinator
  # forgets are kept one day, not thirty
  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 1
      matches_prefix             = ["${local.snapshot_prefix}/"]
    }
    action {
      type = "Delete"
    }
  }
}

resource "google_storage_bucket_object" "wheel" {
  count = var.spotring_wheel == null ? 0 : 1

  bucket       = google_storage_bucket.artifacts.name
  name         = local.wheel_object
  source       = var.spotring_wheel
  content_type = "application/zip"
}

# The daemon stores the wheel it runs (objects.create) and checks what is there (objects.get),
# and lists and reads the workers' shipped logs; the workers read, and create their log chunks
# and exit reports (logs/, exits/: provisioner/drivers/shiplog.py) and, while the daemon is
# away, the ring's snapshots (snapshots.tf): their create grant is conditioned on those
# prefixes. objectCreator cannot overwrite or delete an object, so a worker cannot replace the
# wheel, another's lines or a snapshot.
resource "google_storage_bucket_iam_member" "artifacts" {
  for_each = {
    daemon-create = { role = "roles/storage.objectCreator", member = google_service_account.daemon.email, where = [] }
    daemon-read   = { role = "roles/storage.objectViewer", member = google_service_account.daemon.email, where = [] }
    worker-read   = { role = "roles/storage.objectViewer", member = google_service_account.worker.email, where = [] }
    worker-ship = {
      role  = "roles/storage.objectCreator", member = google_service_account.worker.email,
      where = ["${local.artifacts_prefix}/logs/", "${local.artifacts_prefix}/exits/", "${local.snapshot_job_prefix}/"]
    }
  }

  bucket = google_storage_bucket.artifacts.name
  role   = each.value.role
  member = "serviceAccount:${each.value.member}"

  dynamic "condition" {
    for_each = length(each.value.where) > 0 ? [each.value.where] : []
    content {
      title       = "spotring-${each.key}"
      description = "only objects under ${join(", ", condition.value)}"
      expression = join(" || ", [for p in condition.value :
      "resource.name.startsWith(\"projects/_/buckets/${google_storage_bucket.artifacts.name}/objects/${p}\")"])
    }
  }
}
