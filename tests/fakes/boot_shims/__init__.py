"""Programs a fake instance finds on its PATH (tests/fakes/instances.py): ``systemctl`` (runs a
unit's ExecStart), ``aws`` (SSM and S3 against a moto server), ``gcloud`` (Secret Manager and
Cloud Storage against the fakes), ``nvidia-smi`` (lists fake GPUs), and the instance's pid 1."""
