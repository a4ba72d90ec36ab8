# The ring's durable snapshots (trainer/state/snapshot.py): gs://<artifacts bucket>/snapshots/
# <job_id>/ ([snapshot] url, with the job id the daemon appends). The coordinator inside the
# daemon keeps them (creates, reads, lists, forgets the oldest); while the daemon is away, rank 0
# creates its snapshot there itself (trainer/state/direct.py). The workers' grant is the
# conditioned objectCreator of artifacts.tf (worker-ship): create only, under this job's
# snapshot prefix (and their log prefixes), never overwrite, delete or list. GCS IAM conditions
# can narrow object permissions by object name (resource.name), which is what is used here;
# they cannot narrow objects.list by prefix (its resource is the bucket), so the daemon lists
# the bucket through its bucket-wide objectViewer. Each manifest is signed with a key derived
# from the ring token, so an object put by anything without the token is refused.

locals {
  snapshot_prefix     = "snapshots"
  snapshot_url        = "gs://${google_storage_bucket.artifacts.name}/${local.snapshot_prefix}"
  snapshot_job_prefix = "${local.snapshot_prefix}/${var.job_id}"
}

# The daemon's vault forgets the oldest snapshots (objects.delete): objectUser on this job's
# snapshot prefix only.
resource "google_storage_bucket_iam_member" "daemon_snapshots" {
  bucket = google_storage_bucket.artifacts.name
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.daemon.email}"

  condition {
    title       = "spotring-daemon-snapshots"
    description = "only the ring's snapshots of this job"
    expression  = "resource.name.startsWith(\"projects/_/buckets/${google_storage_bucket.artifacts.name}/objects/${local.snapshot_job_prefix}/\")"
  }
}
