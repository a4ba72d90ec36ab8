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

worker_machine_type = "n1-standard-8"
worker_gpu = {
  type  = "nvidia-tesla-t4"
  count = 1
}

daemon_machine_type = "e2-small"
max_workers         = 8
spotring_package    = "spotring[gcp]==0.1.0"
