# terraform -chdir=terraform/aws apply -var-file=../examples/aws.tfvars
# with the ring token from the environment (never in a file):
#   export TF_VAR_ring_token=$(openssl rand -hex 32)
region     = "us-east-1"
job_id     = "resnet-cifar"
job_module = "spotring_examples.digits"

vpc_id     = "vpc-0123456789abcdef0"
subnet_ids = ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"]

# AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) in us-east-1; look it up with
#   aws ssm get-parameter --name /aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id
worker_ami_id        = "ami-0123456789abcdef0"
worker_instance_type = "g5.xlarge"
worker_volume_gb     = 100

daemon_instance_type = "t3.small"
max_workers          = 8
price_regions        = ["us-east-1", "us-west-2"]

# The spotring wheel to deploy, built from a checkout (`pip wheel --no-deps -w dist .`); the
# path is read from terraform/aws (-chdir). Terraform uploads it to the run's artifacts
# bucket and every VM installs it pinned by its SHA-256: nothing of spotring comes from PyPI.
spotring_wheel = "../../dist/spotring-0.1.0-py3-none-any.whl"

tags = {
  team = "ml"
}
