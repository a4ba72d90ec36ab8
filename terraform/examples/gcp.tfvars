# terraform -chdir=terraform/gcp apply -var-file=../examples/gcp.tfvars
# with the ring token from the environment (never in a file):
#   export TF_VAR_ring_token=$(openssl rand -hex 32)
project    = "my-training-project"
region     = "us-central1"
zones      = ["us-central1-a", "us-central1-b", "us-central1-c"]
job_id     = "resnet-cifar"
job_module = "spotring_examples.digits"

# The ring gets its own network, subnetwork and Cloud NAT (nothing else of the project shares
# them). To use an existing network instead, name both (docs/deploy.md says what that gives):
#   network    = "shared-vpc"
#   subnetwork = "shared-vpc-us-central1"

# Workers need NVIDIA drivers, gcloud and a Python >= 3.11 with PyTorch (worker_python): an
# image of your own (docs/deploy.md, "Images"); Python 3.10 images are refused at boot.
worker_image        = "projects/my-training-project/global/images/family/spotring-worker"
worker_python       = "python3"
worker_machine_type = "n1-standard-8"
worker_gpu = {
  type  = "nvidia-tesla-t4"
  count = 1
}

daemon_machine_type = "e2-small"
max_workers         = 8

# The spotring wheel to deploy, built from a checkout (`pip wheel --no-deps -w dist .`); the
# path is read from terraform/gcp (-chdir). Terraform uploads it to the run's artifacts
# bucket and every VM installs it pinned by its SHA-256: nothing of spotring comes from PyPI.
spotring_wheel = "../../dist/spotring-0.1.0-py3-none-any.whl"
